{{/* Names, labels and the pieces both layouts share. */}}

{{- define "extauthz.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "extauthz.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "extauthz.selectorLabels" -}}
app.kubernetes.io/name: {{ include "extauthz.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "extauthz.labels" -}}
{{ include "extauthz.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: extauthz
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "extauthz.configMapName" -}}
{{- .Values.config.existingConfigMap | default (printf "%s-config" (include "extauthz.fullname" .)) -}}
{{- end -}}

{{- define "extauthz.configKey" -}}
{{- if .Values.config.existingConfigMap -}}{{ .Values.config.existingConfigMapKey }}{{- else -}}extauthz.yaml{{- end -}}
{{- end -}}

{{/* Pods the limits are shared by: the floor of the autoscaler, or the
replica count. min_peers defaults to it, so a replica that loses Redis
before hearing its peers takes its share, not the whole limit. */}}
{{- define "extauthz.minPeers" -}}
{{- if not (kindIs "invalid" .Values.minPeers) -}}
{{- .Values.minPeers | int -}}
{{- else if .Values.autoscaling.enabled -}}
{{- .Values.autoscaling.minReplicas | int -}}
{{- else -}}
{{- .Values.replicas | int -}}
{{- end -}}
{{- end -}}

{{/* redis.sentinel, with every key present: a user may null the section
or leave keys out. */}}
{{- define "extauthz.sentinelValues" -}}
{{- toYaml (merge (deepCopy (.Values.redis.sentinel | default dict)) (dict "masterName" "" "addrs" list "existingSecret" "" "existingSecretKey" "password" "passwordEnv" "SENTINEL_PASSWORD")) -}}
{{- end -}}

{{/* "true" when the values ask for Sentinel: either of its two required
fields set, so a half-filled section is refused rather than ignored. */}}
{{- define "extauthz.sentinel" -}}
{{- $s := include "extauthz.sentinelValues" . | fromYaml -}}
{{- if or $s.masterName $s.addrs -}}true{{- end -}}
{{- end -}}

{{/* "true" when the chart's values name a Redis, by addrs or through
Sentinel. */}}
{{- define "extauthz.redis" -}}
{{- if or .Values.redis.addrs (include "extauthz.sentinel" .) -}}true{{- end -}}
{{- end -}}

{{/* Refuses redis values the sidecar would refuse at start-up, or that
would silently mean something else, with the values' own names. */}}
{{- define "extauthz.checkRedis" -}}
{{- if include "extauthz.sentinel" . -}}
{{- $s := include "extauthz.sentinelValues" . | fromYaml -}}
{{- if .Values.redis.addrs -}}
{{- fail (printf "redis.addrs %v and redis.sentinel: give one, not both. With Sentinel the sentinels name the master: set redis.addrs to [] and list the sentinels in redis.sentinel.addrs" .Values.redis.addrs) -}}
{{- end -}}
{{- if not $s.masterName -}}
{{- fail "redis.sentinel.masterName: required with redis.sentinel.addrs, the name the sentinels monitor the master by (`sentinel monitor <name> ...`)" -}}
{{- end -}}
{{- if not $s.addrs -}}
{{- fail "redis.sentinel.addrs: required with redis.sentinel.masterName, every sentinel's host:port" -}}
{{- end -}}
{{- if and $s.existingSecret .Values.redis.existingSecret (eq $s.passwordEnv .Values.redis.passwordEnv) -}}
{{- fail (printf "redis.sentinel.passwordEnv and redis.passwordEnv are both %s: the sentinels' password needs a variable of its own" $s.passwordEnv) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The extauthz configuration the chart writes: config.settings with
listen, redis and fallback.min_peers added where settings leaves them out. */}}
{{- define "extauthz.config" -}}
{{- $cfg := deepCopy .Values.config.settings -}}
{{- $_ := set $cfg "listen" (dict "grpc" (include "extauthz.grpcListen" .) "admin" (printf "0.0.0.0:%d" (.Values.service.adminPort | int))) -}}
{{- $sentinel := include "extauthz.sentinel" . -}}
{{- if and (include "extauthz.redis" .) (not (hasKey $cfg "redis")) -}}
{{- $redis := dict -}}
{{- if $sentinel -}}
{{- $s := include "extauthz.sentinelValues" . | fromYaml -}}
{{- $rs := dict "master_name" $s.masterName "addrs" $s.addrs -}}
{{- if $s.existingSecret -}}{{- $_ := set $rs "password_env" $s.passwordEnv -}}{{- end -}}
{{- $_ := set $redis "sentinel" $rs -}}
{{- else -}}
{{- $_ := set $redis "addrs" .Values.redis.addrs -}}
{{- end -}}
{{- if .Values.redis.existingSecret -}}{{- $_ := set $redis "password_env" .Values.redis.passwordEnv -}}{{- end -}}
{{- if .Values.redis.tls -}}{{- $_ := set $redis "tls" true -}}{{- end -}}
{{- $_ := set $cfg "redis" $redis -}}
{{- end -}}
{{- $fallback := deepCopy (get $cfg "fallback" | default dict) -}}
{{- if not (hasKey $fallback "min_peers") -}}
{{- $_ := set $fallback "min_peers" (include "extauthz.minPeers" . | int) -}}
{{- end -}}
{{- $_ := set $cfg "fallback" $fallback -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Where Check listens: beside its Envoy in the pod (sidecar layout) on
loopback, which no other pod can reach whatever the CNI; shared, on the pod
IP, behind Istio's mTLS and ALLOW policy. */}}
{{- define "extauthz.grpcListen" -}}
{{- if eq .Values.layout "sidecar" -}}
{{- printf "127.0.0.1:%d" (.Values.service.grpcPort | int) -}}
{{- else -}}
{{- printf "0.0.0.0:%d" (.Values.service.grpcPort | int) -}}
{{- end -}}
{{- end -}}

{{- define "extauthz.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The extauthz container, the same in both layouts (an init container
with restartPolicy: Always, a native sidecar, in the sidecar layout). */}}
{{- define "extauthz.container" -}}
- name: extauthz
  image: {{ include "extauthz.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if eq .Values.layout "sidecar" }}
  restartPolicy: Always
  {{- end }}
  args:
    - serve
    - -config=/etc/extauthz/{{ include "extauthz.configKey" . }}
    - -log-format={{ .Values.logFormat }}
    - -log-level={{ .Values.logLevel }}
    {{- if eq .Values.layout "shared" }}
    - -drain-delay={{ .Values.drainDelay }}
    {{- end }}
    - -grace={{ .Values.grace }}
    {{- range .Values.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    # The chart owns the listen addresses, whatever the file says.
    - name: EXTAUTHZ_LISTEN_GRPC
      value: "{{ include "extauthz.grpcListen" . }}"
    - name: EXTAUTHZ_LISTEN_ADMIN
      value: "0.0.0.0:{{ .Values.service.adminPort }}"
    # Heartbeats into Redis under the pod's name; the live count sizes the
    # fallback buckets (limit / replicas) while Redis is down.
    - name: EXTAUTHZ_REPLICA_ID
      valueFrom:
        fieldRef: {fieldPath: metadata.name}
    {{- $sentinel := include "extauthz.sentinel" . }}
    {{- if and (include "extauthz.redis" .) .Values.redis.existingSecret }}
    - name: {{ .Values.redis.passwordEnv }}
      valueFrom:
        secretKeyRef: {name: {{ .Values.redis.existingSecret }}, key: {{ .Values.redis.existingSecretKey }}}
    {{- end }}
    {{- $s := include "extauthz.sentinelValues" . | fromYaml }}
    {{- if and $sentinel $s.existingSecret }}
    - name: {{ $s.passwordEnv }}
      valueFrom:
        secretKeyRef: {name: {{ $s.existingSecret }}, key: {{ $s.existingSecretKey }}}
    {{- end }}
    # The Go runtime sized to the container, not the node.
    - name: GOMAXPROCS
      valueFrom:
        resourceFieldRef: {resource: limits.cpu}
    - name: GOMEMLIMIT
      valueFrom:
        resourceFieldRef: {resource: limits.memory}
    {{- if .Values.tracing.endpoint }}
    - name: OTEL_EXPORTER_OTLP_ENDPOINT
      value: {{ .Values.tracing.endpoint | quote }}
    - name: OTEL_EXPORTER_OTLP_PROTOCOL
      value: {{ .Values.tracing.protocol | quote }}
    - name: OTEL_TRACES_SAMPLER
      value: {{ .Values.tracing.sampler | quote }}
    {{- if .Values.tracing.samplerArg }}
    - name: OTEL_TRACES_SAMPLER_ARG
      value: {{ .Values.tracing.samplerArg | quote }}
    {{- end }}
    - name: OTEL_RESOURCE_ATTRIBUTES
      value: "k8s.namespace.name={{ .Release.Namespace }}"
    {{- end }}
    {{- with .Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    # Declared in both layouts, so the pod says what it listens on (in the
    # sidecar layout on loopback only).
    - {name: grpc, containerPort: {{ .Values.service.grpcPort }}}
    - {name: admin, containerPort: {{ .Values.service.adminPort }}}
  # The probes go to the admin port, which makes no decisions (in the
  # sidecar layout Check listens on loopback, which the kubelet cannot
  # reach): /readyz answers 200 once the config is loaded and the
  # listeners are up, 503 while draining. Liveness asks only whether the
  # process is alive, so a draining pod is not restarted.
  startupProbe:
    httpGet: {path: /readyz, port: admin}
    periodSeconds: 1
    failureThreshold: 30
  readinessProbe:
    httpGet: {path: /readyz, port: admin}
    periodSeconds: 5
  livenessProbe:
    httpGet: {path: /healthz, port: admin}
    periodSeconds: 10
    failureThreshold: 3
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities: {drop: [ALL]}
  volumeMounts:
    # A directory mount (no subPath): ConfigMap edits reach the file and
    # extauthz reloads them.
    - {name: extauthz-config, mountPath: /etc/extauthz, readOnly: true}
{{- end -}}

{{- define "extauthz.podSecurityContext" -}}
automountServiceAccountToken: false
terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.topologySpread }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "extauthz.selectorLabels" . | nindent 8 }}
{{- end }}
{{- end -}}
