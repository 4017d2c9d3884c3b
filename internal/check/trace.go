package check

import authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

// RequestIDHeader is the request id Envoy's HTTP connection manager gives
// every request (generate_request_id, on by default) before ext_authz
// runs. Envoy's access log prints it as %REQ(X-REQUEST-ID)%; the decision
// log and the Check span carry the same value, so one 503 or 429 can be
// followed across both.
const RequestIDHeader = "x-request-id"

// decisionStatus is the HTTP status Envoy answers with for resp: 200 for an
// allowed request, the denied response's status otherwise, 0 when there is
// no response (a gRPC error).
func decisionStatus(resp *authv3.CheckResponse) int {
	switch {
	case resp == nil:
		return 0
	case resp.GetOkResponse() != nil:
		return 200
	}
	return int(resp.GetDeniedResponse().GetStatus().GetCode())
}
