package deploy

import (
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The proxies/ configurations go together: nginx, Caddy and Traefik each
// ask the HTTP door that proxies/extauthz.yaml serves. tests/nginx_test.go
// and tests/caddy run nginx and Caddy for real (with the ports changed);
// these checks hold the shipped files to one another, and Traefik's, which
// no test runs, to the door's forward-auth convention.

// forwardAuthPath is where the door reads the forward-auth convention
// (httpauth.ForwardAuthPath); nginxPath the nginx one (httpauth.NginxPath).
const (
	forwardAuthPath = "/forward-auth"
	nginxPath       = "/nginx"
)

// proxiesSidecar is proxies/extauthz.yaml, validated by `extauthz validate`.
func proxiesSidecar(t *testing.T) *sidecarConfig {
	t.Helper()
	raw := readFile(t, repoPath(t, "proxies/extauthz.yaml"))
	validateSidecarConfig(t, "proxies/extauthz.yaml", raw, nil)
	sc, err := parseSidecarConfig(raw)
	if err != nil {
		t.Fatalf("proxies/extauthz.yaml: %v", err)
	}
	if sc.Listen.HTTP == "" {
		t.Fatal("proxies/extauthz.yaml: no listen.http")
	}
	if l, err := parseListen(sc.Listen.HTTP); err != nil || !l.isLoopback() {
		t.Errorf("proxies/extauthz.yaml: listen.http %q must be a fixed loopback address: the door trusts what its caller says", sc.Listen.HTTP)
	}
	return sc
}

func TestNginxConfigAsksTheDoor(t *testing.T) {
	sc := proxiesSidecar(t)
	conf := string(readFile(t, repoPath(t, "proxies/nginx/extauthz.conf")))
	for _, want := range []string{
		"server " + sc.Listen.HTTP + ";",                      // the upstream extauthz
		"proxy_pass http://extauthz" + nginxPath + ";",        // the door's nginx convention
		"proxy_set_header X-Original-URI $request_uri;",       // http.uri_header, default
		"proxy_set_header X-Original-Method $request_method;", // http.method_header, default
		"auth_request_set $extauthz_problem $upstream_http_x_extauthz_problem;",
		"proxy_set_header " + canonical(sc.keyHeader()) + ` "";`, // the app never sees the key
	} {
		if !strings.Contains(collapseSpaces(conf), want) {
			t.Errorf("proxies/nginx/extauthz.conf lacks %q", want)
		}
	}
}

func TestCaddyfileAsksTheDoor(t *testing.T) {
	sc := proxiesSidecar(t)
	conf := string(readFile(t, repoPath(t, "proxies/caddy/Caddyfile")))
	for _, want := range []string{
		"forward_auth " + sc.Listen.HTTP + " {",
		"uri " + forwardAuthPath,
		"copy_headers X-Client-Id",
		"request_header -" + canonical(sc.keyHeader()),
	} {
		if !strings.Contains(collapseSpaces(conf), want) {
			t.Errorf("proxies/caddy/Caddyfile lacks %q", want)
		}
	}
}

// traefikDynamic is the part of Traefik's file-provider dynamic
// configuration the snippet uses, with Traefik's field names; decoding is
// strict, so a misspelt field fails here rather than being ignored.
type traefikDynamic struct {
	HTTP struct {
		Routers map[string]struct {
			EntryPoints []string `json:"entryPoints"`
			Rule        string   `json:"rule"`
			Middlewares []string `json:"middlewares"`
			Service     string   `json:"service"`
		} `json:"routers"`
		Middlewares map[string]struct {
			ForwardAuth *struct {
				Address             string   `json:"address"`
				TrustForwardHeader  bool     `json:"trustForwardHeader"`
				AuthResponseHeaders []string `json:"authResponseHeaders"`
			} `json:"forwardAuth"`
			Headers *struct {
				CustomRequestHeaders map[string]string `json:"customRequestHeaders"`
			} `json:"headers"`
		} `json:"middlewares"`
		Services map[string]struct {
			LoadBalancer struct {
				Servers []struct {
					URL string `json:"url"`
				} `json:"servers"`
			} `json:"loadBalancer"`
		} `json:"services"`
	} `json:"http"`
}

func TestTraefikForwardAuth(t *testing.T) {
	sc := proxiesSidecar(t)
	var d traefikDynamic
	if err := yaml.UnmarshalStrict(readFile(t, repoPath(t, "proxies/traefik/dynamic.yml")), &d); err != nil {
		t.Fatalf("proxies/traefik/dynamic.yml: %v", err)
	}
	if len(d.HTTP.Routers) == 0 {
		t.Fatal("proxies/traefik/dynamic.yml: no routers")
	}
	for name, r := range d.HTTP.Routers {
		var auth, strip string
		for _, m := range r.Middlewares {
			mw, ok := d.HTTP.Middlewares[m]
			switch {
			case !ok:
				t.Errorf("router %s: middleware %s is not defined", name, m)
			case mw.ForwardAuth != nil:
				auth = m
				fa := mw.ForwardAuth
				if want := "http://" + sc.Listen.HTTP + forwardAuthPath; fa.Address != want {
					t.Errorf("middleware %s: address %q, want %q (proxies/extauthz.yaml's HTTP door)", m, fa.Address, want)
				}
				if fa.TrustForwardHeader {
					t.Errorf("middleware %s: trustForwardHeader lets clients choose the X-Forwarded-* the door reads", m)
				}
				if !containsFold(fa.AuthResponseHeaders, "x-client-id") {
					t.Errorf("middleware %s: authResponseHeaders lacks X-Client-Id", m)
				}
			case mw.Headers != nil:
				if v, ok := mw.Headers.CustomRequestHeaders[canonical(sc.keyHeader())]; ok && v == "" {
					strip = m
				}
			}
		}
		if auth == "" {
			t.Errorf("router %s: no forwardAuth middleware", name)
		}
		if strip == "" {
			t.Errorf("router %s: no middleware removes %s before the app", name, sc.keyHeader())
		}
		if _, ok := d.HTTP.Services[r.Service]; !ok {
			t.Errorf("router %s: service %q is not defined", name, r.Service)
		}
	}
}

var spaces = regexp.MustCompile(`[ \t]+`)

// collapseSpaces turns runs of blanks into one space, so alignment in a
// file does not matter to the checks.
func collapseSpaces(s string) string { return spaces.ReplaceAllString(s, " ") }

// canonical spells a header name as the proxies' files do: X-Api-Key.
func canonical(h string) string {
	parts := strings.Split(h, "-")
	for i, p := range parts {
		if p != "" {
			parts[i] = strings.ToUpper(p[:1]) + p[1:]
		}
	}
	return strings.Join(parts, "-")
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

// docs/http-door.md's section per proxy shows its config with comments
// trimmed: every line it shows must be a line of the shipped file
// (comments and blanks aside), so the two cannot drift apart.
func TestDocumentedProxyConfigsAreTheShippedOnes(t *testing.T) {
	doc := string(readFile(t, repoPath(t, "docs/http-door.md")))
	for _, c := range []struct{ heading, fence, file string }{
		{"## nginx `auth_request`", "```nginx", "proxies/nginx/extauthz.conf"},
		{"## Caddy `forward_auth`", "```caddyfile", "proxies/caddy/Caddyfile"},
		{"## Traefik `forwardAuth`", "```yaml", "proxies/traefik/dynamic.yml"},
		{"## Envoy `http_service`", "```yaml", "envoy/envoy-http.yaml"},
	} {
		_, section, ok := strings.Cut(doc, "\n"+c.heading+"\n")
		if !ok {
			t.Errorf("docs/http-door.md has no section %q", c.heading)
			continue
		}
		_, block, ok := strings.Cut(section, "\n"+c.fence+"\n")
		block, _, closed := strings.Cut(block, "\n```\n")
		if !ok || !closed {
			t.Errorf("docs/http-door.md section %q has no %s block", c.heading, c.fence)
			continue
		}
		shipped := map[string]bool{}
		for _, line := range strings.Split(string(readFile(t, repoPath(t, c.file))), "\n") {
			shipped[configLine(line)] = true
		}
		for _, line := range strings.Split(block, "\n") {
			if l := configLine(line); l != "" && !shipped[l] {
				t.Errorf("docs/http-door.md %s shows %q, which %s lacks", c.heading, l, c.file)
			}
		}
	}
}

// configLine is a config line without its comment, indentation and a
// YAML list dash, blanks collapsed.
func configLine(line string) string {
	if i := strings.Index(line, " #"); i >= 0 {
		line = line[:i]
	}
	if strings.HasPrefix(strings.TrimSpace(line), "#") {
		return ""
	}
	line = strings.TrimPrefix(strings.TrimSpace(line), "- ")
	return collapseSpaces(strings.TrimSpace(line))
}
