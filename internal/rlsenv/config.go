package rlsenv

import (
	"crypto/sha256"
	"fmt"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/extauthz/extauthz/internal/config"
)

// Source names a configuration read from the environment alone (no
// EXTAUTHZ_OVERLAY) in messages.
const Source = "environment"

// Config is the sidecar's configuration this environment describes: the
// listeners, TLS, Redis and the rate limit service's answers from the
// anchor's variables, everything else from the EXTAUTHZ_OVERLAY file when
// one is named (and extauthz's defaults otherwise). A setting both give
// is an error naming the variables and the file. With CONFIG_TYPE=FILE
// the descriptors are read from RuntimeDir; over xDS they come later.
func (e *Env) Config() (*config.Config, error) {
	// What the environment says, and what it implies only by default
	// (the overlay may say otherwise).
	said := map[string]any{}
	implied := map[string]any{
		// Limits count in Redis when there is one, as the anchor's do.
		"default_mode": "local",
		// The anchor sends no headers unless asked (limit_headers), and
		// counts every descriptor of a request, the one over its limit
		// included (rls.counting; STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
		// counts only the ones over when one is).
		"rls": map[string]any{"response_headers": false, "counting": e.counting()},
	}
	listen := map[string]any{"grpc": e.GRPCAddr, "admin": e.HTTPAddr}
	if t := e.ServerTLS; t != nil {
		tls := map[string]any{"cert_file": t.CertFile, "key_file": t.KeyFile}
		if t.ClientCAFile != "" {
			tls["client_ca_file"] = t.ClientCAFile
		}
		listen["tls"] = tls
	}
	said["listen"] = listen
	if rd := e.Redis; rd != nil {
		implied["default_mode"] = "redis"
		r := map[string]any{"pool_size": rd.PoolSize}
		if rd.MasterName != "" {
			s := map[string]any{"master_name": rd.MasterName, "addrs": rd.Addrs}
			if rd.SentinelAuthVar != "" {
				s["password_env"] = rd.SentinelAuthVar
			}
			if rd.sentinelUser != "" {
				s["username"] = rd.sentinelUser
			}
			r["sentinel"] = s
		} else {
			r["addrs"] = rd.Addrs
		}
		if rd.AuthVar != "" {
			r["password_env"] = rd.AuthVar
		}
		if rd.User != "" {
			r["username"] = rd.User
		}
		if rd.KeyPrefix != "" {
			r["key_prefix"] = rd.KeyPrefix
		}
		if t := rd.TLS; t != nil {
			tls := map[string]any{"insecure_skip_verify": t.SkipVerify}
			for k, v := range map[string]string{"ca_file": t.CAFile, "cert_file": t.CertFile, "key_file": t.KeyFile} {
				if v != "" {
					tls[k] = v
				}
			}
			r["tls"] = tls
		}
		said["redis"] = r
	}
	rls := map[string]any{}
	if e.ConfigType == ConfigFile {
		rls["domains"] = []string{e.RuntimeDir}
	}
	for k, on := range map[string]bool{"shadow_mode": e.ShadowMode, "quota_mode": e.QuotaMode, "dynamic_metadata": e.DynamicMetadata} {
		if on {
			rls[k] = true
		}
	}
	if h := e.LimitHeaders; h != nil {
		rls["limit_headers"] = map[string]any{"limit": h.Limit, "remaining": h.Remaining, "reset": h.Reset}
	}
	if len(rls) > 0 {
		said["rls"] = rls
	}

	name, doc := Source, said
	var overlayData []byte
	if e.Overlay != "" {
		var err error
		overlayData, err = os.ReadFile(e.Overlay)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", OverlayVar, err)
		}
		overlay, err := parseYAML(overlayData, e.Overlay)
		if err != nil {
			return nil, err
		}
		if overlay == nil {
			overlay = map[string]any{}
		}
		if err := mergeInto(overlay, said, "", e.Overlay); err != nil {
			return nil, err
		}
		name, doc = e.Overlay, overlay
	}
	layOver(implied, doc)
	data, err := yaml.Marshal(implied)
	if err != nil {
		return nil, fmt.Errorf("rlsenv: %w", err)
	}
	cfg, err := config.Parse(data, name)
	if err != nil {
		return nil, err
	}
	if e.ServerTLS != nil && cfg.Listen.TLS != nil {
		cfg.Listen.TLS.ClientSAN = e.ServerTLS.ClientSAN
	}
	if overlayData != nil {
		// What the configuration watch compares the file with.
		cfg.Digest = sha256.Sum256(overlayData)
	}
	return cfg, nil
}

// parseYAML checks that data is a YAML mapping, for the file's own
// syntax errors with their lines.
func parseYAML(data []byte, name string) (map[string]any, error) {
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s (%s): %w", name, OverlayVar, err)
	}
	return m, nil
}

// sources says which variables set each of the environment's keys.
var sources = map[string]string{
	"listen": "HOST, PORT, GRPC_HOST, GRPC_PORT, GRPC_UDS, GRPC_SERVER_*",
	"redis":  "REDIS_*, CACHE_KEY_PREFIX",
	"rls":    "CONFIG_TYPE, RUNTIME_*, SHADOW_MODE, QUOTA_MODE, RESPONSE_DYNAMIC_METADATA, LIMIT_*",
}

// counting is the rls.counting the environment implies.
func (e *Env) counting() string {
	if e.StopIncrementWhenOver {
		return config.CountingEachStopWhenOver
	}
	return config.CountingEach
}

// mergeInto adds src's settings to dst; a setting both have is an error.
func mergeInto(dst, src map[string]any, path, file string) error {
	keys := make([]string, 0, len(src))
	for k := range src {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		p := strings.TrimPrefix(path+"."+k, ".")
		sv := src[k]
		dv, both := dst[k]
		if !both {
			dst[k] = sv
			continue
		}
		dm, dok := dv.(map[string]any)
		sm, sok := sv.(map[string]any)
		if dok && sok {
			if err := mergeInto(dm, sm, p, file); err != nil {
				return err
			}
			continue
		}
		top, _, _ := strings.Cut(p, ".")
		return fmt.Errorf("%s: %s: is set by the environment (%s); leave it out of the file (%s)", file, p, sources[top], OverlayVar)
	}
	return nil
}

// layOver sets over's settings in base, over's winning.
func layOver(base, over map[string]any) {
	for k, ov := range over {
		bm, bok := base[k].(map[string]any)
		om, ook := ov.(map[string]any)
		if bok && ook {
			layOver(bm, om)
			continue
		}
		base[k] = ov
	}
}
