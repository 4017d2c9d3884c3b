package rlsenv

import (
	"fmt"
	"strconv"
	"strings"
)

// Export sets the variables the rest of the process reads, before it
// starts: the password of a REDIS_AUTH (or REDIS_SENTINEL_AUTH) of the
// form user:password, alone, under the variable the configuration names;
// and the anchor's TRACING_* as the OpenTelemetry variables
// internal/tracing reads (with TRACING_ENABLED off, tracing is off even
// when OTEL_EXPORTER_OTLP_ENDPOINT is set, as the anchor's is). setenv is
// os.Setenv in the process.
func (e *Env) Export(lookup Lookup, setenv func(name, value string) error) error {
	set := func(name, value string) error {
		if err := setenv(name, value); err != nil {
			return fmt.Errorf("rlsenv: setting %s: %w", name, err)
		}
		return nil
	}
	if rd := e.Redis; rd != nil {
		if rd.AuthVar == redisPasswordVar {
			_, pass, _ := strings.Cut(rd.rawAuth, ":")
			if err := set(redisPasswordVar, pass); err != nil {
				return err
			}
		}
		if rd.SentinelAuthVar == sentinelPasswordVar {
			v, _ := lookup("REDIS_SENTINEL_AUTH")
			_, pass, _ := strings.Cut(v, ":")
			if err := set(sentinelPasswordVar, pass); err != nil {
				return err
			}
		}
	}
	t := e.Tracing
	if t == nil {
		return set("OTEL_SDK_DISABLED", "true")
	}
	vars := map[string]string{
		"OTEL_SERVICE_NAME":           t.ServiceName,
		"OTEL_TRACES_SAMPLER":         "parentbased_traceidratio",
		"OTEL_TRACES_SAMPLER_ARG":     strconv.FormatFloat(t.SamplingRate, 'g', -1, 64),
		"OTEL_TRACES_EXPORTER":        "otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL": map[string]string{"http": "http/protobuf", "grpc": "grpc"}[t.Protocol],
		"OTEL_EXPORTER_OTLP_ENDPOINT": t.Endpoint,
		"OTEL_RESOURCE_ATTRIBUTES":    resourceAttributes(t),
	}
	for k, v := range vars {
		if v == "" {
			continue
		}
		if err := set(k, v); err != nil {
			return err
		}
	}
	return nil
}

func resourceAttributes(t *Tracing) string {
	var a []string
	if t.ServiceNamespace != "" {
		a = append(a, "service.namespace="+t.ServiceNamespace)
	}
	if t.InstanceID != "" {
		a = append(a, "service.instance.id="+t.InstanceID)
	}
	return strings.Join(a, ",")
}
