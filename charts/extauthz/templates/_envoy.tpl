{{/* Envoy's bootstrap for the sidecar layout: envoy/envoy.yaml with the
chart's ports and limits (see the comments there for each choice). */}}
{{- define "extauthz.envoy" -}}
admin:
  address:
    socket_address: {address: 127.0.0.1, port_value: 9901}
overload_manager:
  refresh_interval: 0.25s
  resource_monitors:
    - name: envoy.resource_monitors.fixed_heap
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig
        max_heap_size_bytes: {{ .Values.envoy.maxHeapBytes | int64 }}
    - name: envoy.resource_monitors.global_downstream_max_connections
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig
        max_active_downstream_connections: 10000
  actions:
    - name: envoy.overload_actions.shrink_heap
      triggers:
        - name: envoy.resource_monitors.fixed_heap
          threshold: {value: 0.95}
    - name: envoy.overload_actions.stop_accepting_requests
      triggers:
        - name: envoy.resource_monitors.fixed_heap
          threshold: {value: 0.98}
static_resources:
  listeners:
    - name: ingress
      address:
        socket_address: {address: 0.0.0.0, port_value: {{ .Values.envoy.port }}}
      per_connection_buffer_limit_bytes: 32768
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                codec_type: AUTO
                use_remote_address: true
                normalize_path: true
                merge_slashes: true
                path_with_escaped_slashes_action: UNESCAPE_AND_REDIRECT
                common_http_protocol_options:
                  idle_timeout: 300s
                  headers_with_underscores_action: REJECT_REQUEST
                request_headers_timeout: 10s
                stream_idle_timeout: 300s
                http2_protocol_options:
                  max_concurrent_streams: 100
                  initial_stream_window_size: 65536
                  initial_connection_window_size: 1048576
                generate_request_id: true
                access_log:
                  - name: envoy.access_loggers.stdout
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog
                      log_format:
                        json_format:
                          time: "%START_TIME%"
                          request_id: "%REQ(X-REQUEST-ID)%"
                          method: "%REQ(:METHOD)%"
                          path: "%REQ(:PATH)%"
                          status: "%RESPONSE_CODE%"
                          flags: "%RESPONSE_FLAGS%"
                          duration_ms: "%DURATION%"
                          client: "%DYNAMIC_METADATA(envoy.filters.http.ext_authz:client)%"
                          policy: "%DYNAMIC_METADATA(envoy.filters.http.ext_authz:policy)%"
                          remaining: "%DYNAMIC_METADATA(envoy.filters.http.ext_authz:remaining)%"
                          result: "%DYNAMIC_METADATA(envoy.filters.http.ext_authz:result)%"
                http_filters:
                  - name: envoy.filters.http.ext_authz
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz
                      transport_api_version: V3
                      grpc_service:
                        envoy_grpc: {cluster_name: extauthz}
                        timeout: {{ .Values.envoy.timeout }}
                      # Fail closed: extauthz also rejects unknown API keys.
                      failure_mode_allow: false
                      status_on_error: {code: ServiceUnavailable}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
                route_config:
                  name: app
                  virtual_hosts:
                    - name: app
                      domains: ["*"]
                      routes:
                        - name: health
                          match: {path: {{ .Values.app.healthPath }}}
                          route: {cluster: app}
                          request_headers_to_remove: [x-client-id]
                          typed_per_filter_config:
                            envoy.filters.http.ext_authz:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute
                              disabled: true
                        - name: default
                          match: {prefix: /}
                          route: {cluster: app}
    - name: stats
      address:
        socket_address: {address: 0.0.0.0, port_value: {{ .Values.envoy.statsPort }}}
      per_connection_buffer_limit_bytes: 32768
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: stats
                codec_type: AUTO
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
                route_config:
                  name: stats
                  virtual_hosts:
                    - name: stats
                      domains: ["*"]
                      routes:
                        - match: {path: /stats/prometheus}
                          route: {cluster: envoy_admin}
  clusters:
    - name: envoy_admin
      type: STATIC
      connect_timeout: 0.25s
      load_assignment:
        cluster_name: envoy_admin
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {address: 127.0.0.1, port_value: 9901}
    - name: extauthz
      type: STATIC
      connect_timeout: 0.25s
      circuit_breakers:
        thresholds:
          - priority: DEFAULT
            max_requests: {{ .Values.envoy.maxChecksInFlight | int }}
            max_pending_requests: {{ .Values.envoy.maxChecksInFlight | int }}
            max_connections: 16
            max_retries: 0
            track_remaining: true
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {}
      load_assignment:
        cluster_name: extauthz
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {address: 127.0.0.1, port_value: {{ .Values.service.grpcPort }}}
    - name: app
      type: STATIC
      connect_timeout: 1s
      per_connection_buffer_limit_bytes: 32768
      load_assignment:
        cluster_name: app
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {address: 127.0.0.1, port_value: {{ .Values.app.port }}}
{{- end -}}
