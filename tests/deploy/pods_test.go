package deploy

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// grpcHealthService is the service name extauthz's gRPC health reports for
// the Authorization service (SERVING once its config is loaded).
const grpcHealthService = "envoy.service.auth.v3.Authorization"

// podInfo is what checkDeployment learned about a pod template, for the
// checks that span objects (Istio providers, isolation).
type podInfo struct {
	deployment  string
	namespace   string
	labels      map[string]string
	annotations map[string]string
	spec        *corev1.PodSpec
	extauthz    *sidecarConfig // nil: no extauthz container
	grpcPort    int32          // extauthz's gRPC containerPort
	sameEnvoy   bool           // an Envoy container in the pod calls it
	alone       bool           // extauthz is the only container
}

// imageRepo returns an image reference without its tag or digest.
func imageRepo(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

func isExtauthz(c *corev1.Container) bool { return path.Base(imageRepo(c.Image)) == "extauthz" }
func isEnvoy(c *corev1.Container) bool {
	return strings.HasSuffix(imageRepo(c.Image), "envoyproxy/envoy")
}

// resolvePort finds the container port a probe or Service port refers to:
// by name, or by number.
func resolvePort(main, init []corev1.Container, port intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, cs := range [][]corev1.Container{main, init} {
		for _, c := range cs {
			for _, cp := range c.Ports {
				if port.Type == intstr.String && cp.Name == port.StrVal ||
					port.Type == intstr.Int && cp.ContainerPort == port.IntVal {
					return cp, true
				}
			}
		}
	}
	return corev1.ContainerPort{}, false
}

// probePort returns the port a probe connects to, resolved against its
// own container's ports.
func probePort(c *corev1.Container, pr *corev1.Probe) (int32, bool) {
	var port intstr.IntOrString
	switch {
	case pr.HTTPGet != nil:
		port = pr.HTTPGet.Port
	case pr.TCPSocket != nil:
		port = pr.TCPSocket.Port
	case pr.GRPC != nil:
		port = intstr.FromInt32(pr.GRPC.Port)
	default:
		return 0, false // exec probes connect nowhere
	}
	cp, ok := resolvePort([]corev1.Container{*c}, nil, port)
	return cp.ContainerPort, ok
}

// fieldPaths the downward API accepts in env (fieldRef).
var fieldPaths = regexp.MustCompile(`^(metadata\.(name|namespace|uid)|metadata\.(labels|annotations)\['[^']+'\]|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))$`)

// varRef is a $(NAME) reference the kubelet expands in command and args.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func checkDeployment(p *problems, s *set, d *object) *podInfo {
	dep := d.k8s.(*appsv1.Deployment)
	tpl := &dep.Spec.Template
	spec := &tpl.Spec
	info := &podInfo{deployment: d.meta.Name, namespace: d.meta.Namespace, labels: tpl.Labels, annotations: tpl.Annotations, spec: spec}
	if dep.Spec.Selector == nil || !selects(dep.Spec.Selector.MatchLabels, tpl.Labels) {
		p.add("%s: spec.selector does not match the pod template's labels", d)
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		p.add("%s: pod securityContext.runAsNonRoot must be true", d)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.add("%s: pod securityContext.seccompProfile must be RuntimeDefault", d)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		p.add("%s: automountServiceAccountToken must be false: nothing here uses the API server", d)
	}
	volumes := map[string]*corev1.Volume{}
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		volumes[v.Name] = v
		if v.ConfigMap != nil && s.find("ConfigMap", v.ConfigMap.Name) == nil {
			p.add("%s: volume %s: ConfigMap %s is not in apply set %s", d, v.Name, v.ConfigMap.Name, s.name)
		}
		if v.Secret != nil && s.find("Secret", v.Secret.SecretName) == nil {
			p.add("%s: volume %s: Secret %s is not in apply set %s", d, v.Name, v.Secret.SecretName, s.name)
		}
	}

	type ctr struct {
		c    *corev1.Container
		init bool
	}
	var all []ctr
	for i := range spec.InitContainers {
		all = append(all, ctr{&spec.InitContainers[i], true})
	}
	for i := range spec.Containers {
		all = append(all, ctr{&spec.Containers[i], false})
	}
	for _, x := range all {
		checkContainer(p, s, d, spec, volumes, x.c, x.init)
	}

	var ext, env *corev1.Container
	for _, x := range all {
		switch {
		case isExtauthz(x.c):
			ext = x.c
		case isEnvoy(x.c):
			env = x.c
		}
	}
	if ext != nil {
		info.alone = len(all) == 1
		info.extauthz, info.grpcPort = checkExtauthzContainer(p, s, d, volumes, ext, info.alone)
	}
	if env != nil {
		info.sameEnvoy = ext != nil
		checkEnvoyContainer(p, s, d, spec, volumes, env, info.extauthz)
	}
	return info
}

func checkContainer(p *problems, s *set, d *object, spec *corev1.PodSpec, volumes map[string]*corev1.Volume, c *corev1.Container, init bool) {
	name := fmt.Sprintf("%s: container %s", d, c.Name)
	sidecar := init && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
	if init && !sidecar && (c.ReadinessProbe != nil || c.LivenessProbe != nil || c.StartupProbe != nil) {
		p.add("%s: an init container that is not a sidecar (restartPolicy: Always) cannot have probes", name)
	}

	repo := imageRepo(c.Image)
	tag := strings.TrimPrefix(strings.TrimPrefix(c.Image, repo), ":")
	if tag == "" || tag == "latest" {
		p.add("%s: image %q: pin a version, not latest", name, c.Image)
	}

	req, lim := c.Resources.Requests, c.Resources.Limits
	if req.Cpu().IsZero() || req.Memory().IsZero() {
		p.add("%s: set resources.requests cpu and memory (the scheduler packs by them)", name)
	}
	if lim.Memory().IsZero() {
		p.add("%s: set resources.limits.memory", name)
	}

	sc := c.SecurityContext
	switch {
	case sc == nil:
		p.add("%s: no securityContext", name)
	default:
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			p.add("%s: allowPrivilegeEscalation must be false", name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			p.add("%s: readOnlyRootFilesystem must be true", name)
		}
		if sc.Capabilities == nil || !containsCap(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			p.add("%s: capabilities must drop ALL and add none", name)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			p.add("%s: runs as root", name)
		}
	}

	for _, pr := range []struct {
		kind  string
		probe *corev1.Probe
	}{{"startupProbe", c.StartupProbe}, {"readinessProbe", c.ReadinessProbe}, {"livenessProbe", c.LivenessProbe}} {
		if pr.probe == nil {
			continue
		}
		if _, ok := probePort(c, pr.probe); !ok && pr.probe.Exec == nil {
			p.add("%s: %s points at a port the container does not declare", name, pr.kind)
		}
	}

	for _, m := range c.VolumeMounts {
		if volumes[m.Name] == nil {
			p.add("%s: mounts volume %s, which the pod does not define", name, m.Name)
		}
		if m.SubPath != "" {
			if v := volumes[m.Name]; v != nil && v.ConfigMap != nil {
				p.add("%s: mounts ConfigMap %s with subPath: edits would never reach the file", name, v.ConfigMap.Name)
			}
		}
	}

	envNames := map[string]bool{}
	for _, e := range c.Env {
		envNames[e.Name] = true
		vf := e.ValueFrom
		if vf == nil {
			continue
		}
		switch {
		case vf.SecretKeyRef != nil:
			if !s.secretHasKey(vf.SecretKeyRef.Name, vf.SecretKeyRef.Key) {
				p.add("%s: env %s: Secret %s has no key %s in apply set %s", name, e.Name, vf.SecretKeyRef.Name, vf.SecretKeyRef.Key, s.name)
			}
		case vf.ConfigMapKeyRef != nil:
			if _, ok := s.configMapKey(vf.ConfigMapKeyRef.Name, vf.ConfigMapKeyRef.Key); !ok {
				p.add("%s: env %s: ConfigMap %s has no key %s", name, e.Name, vf.ConfigMapKeyRef.Name, vf.ConfigMapKeyRef.Key)
			}
		case vf.FieldRef != nil:
			if !fieldPaths.MatchString(vf.FieldRef.FieldPath) {
				p.add("%s: env %s: fieldPath %q is not one the downward API offers to env", name, e.Name, vf.FieldRef.FieldPath)
			}
		case vf.ResourceFieldRef != nil:
			r := vf.ResourceFieldRef
			target := c
			if r.ContainerName != "" {
				target = findContainer(spec, r.ContainerName)
			}
			switch {
			case target == nil:
				p.add("%s: env %s: no container %s", name, e.Name, r.ContainerName)
			case r.Resource == "limits.cpu" && target.Resources.Limits.Cpu().IsZero(),
				r.Resource == "limits.memory" && target.Resources.Limits.Memory().IsZero():
				// Without the limit the kubelet substitutes the node's
				// allocatable: GOMAXPROCS = every core on the node.
				p.add("%s: env %s reads %s, but the container sets no such limit", name, e.Name, r.Resource)
			case !strings.HasPrefix(r.Resource, "limits.") && !strings.HasPrefix(r.Resource, "requests."):
				p.add("%s: env %s: resource %q", name, e.Name, r.Resource)
			}
		}
	}
	for _, arg := range append(append([]string{}, c.Command...), c.Args...) {
		for _, m := range varRef.FindAllStringSubmatch(arg, -1) {
			if !envNames[m[1]] {
				p.add("%s: %q refers to $(%s), which the container's env does not define (it would be passed literally)", name, arg, m[1])
			}
		}
	}
}

func containsCap(caps []corev1.Capability, want corev1.Capability) bool {
	for _, c := range caps {
		if c == want {
			return true
		}
	}
	return false
}

func findContainer(spec *corev1.PodSpec, name string) *corev1.Container {
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

// flagValue returns the value of a command-line flag given as -name=v,
// --name=v, or -name v.
func flagValue(args []string, names ...string) (string, bool) {
	for i, a := range args {
		for _, n := range names {
			for _, prefix := range []string{"-" + n, "--" + n} {
				if v, ok := strings.CutPrefix(a, prefix+"="); ok {
					return v, true
				}
				if a == prefix && i+1 < len(args) {
					return args[i+1], true
				}
			}
		}
	}
	return "", false
}

// mountedConfigMap returns the ConfigMap file at path as the container
// sees it: the ConfigMap and key behind it and the key's text.
func mountedConfigMap(s *set, volumes map[string]*corev1.Volume, c *corev1.Container, file string) (cm, key, text string, err error) {
	for _, m := range c.VolumeMounts {
		dir := strings.TrimSuffix(m.MountPath, "/")
		rest, ok := strings.CutPrefix(file, dir+"/")
		if !ok {
			continue
		}
		v := volumes[m.Name]
		if v == nil || v.ConfigMap == nil {
			return "", "", "", fmt.Errorf("%s is on volume %s, which is not a ConfigMap", file, m.Name)
		}
		key = rest
		for _, it := range v.ConfigMap.Items {
			if it.Path == rest {
				key = it.Key
			}
		}
		text, ok := s.configMapKey(v.ConfigMap.Name, key)
		if !ok {
			return "", "", "", fmt.Errorf("%s: ConfigMap %s has no key %s", file, v.ConfigMap.Name, key)
		}
		return v.ConfigMap.Name, key, text, nil
	}
	return "", "", "", fmt.Errorf("%s is on no mounted volume", file)
}

// checkExtauthzContainer checks the extauthz container against the config
// it loads, which it returns with its gRPC container port. alone says the
// pod runs nothing else (a shared extauthz); otherwise a proxy beside it
// is its one caller.
func checkExtauthzContainer(p *problems, s *set, d *object, volumes map[string]*corev1.Volume, c *corev1.Container, alone bool) (*sidecarConfig, int32) {
	name := fmt.Sprintf("%s: container %s", d, c.Name)
	file, ok := flagValue(c.Args, "config")
	if !ok {
		p.add("%s: no -config: it would serve the embedded demo configuration", name)
		return nil, 0
	}
	cm, key, text, err := mountedConfigMap(s, volumes, c, file)
	if err != nil {
		p.add("%s: %v", name, err)
		return nil, 0
	}
	// The files beside the config in its mounted ConfigMap: the
	// descriptor files its rls.domains names.
	siblings := map[string][]byte{}
	if o := s.find("ConfigMap", cm); o != nil {
		for k, v := range o.k8s.(*corev1.ConfigMap).Data {
			siblings[k] = []byte(v)
		}
	}
	if err := extauthzValidate(fmt.Sprintf("%s (ConfigMap %s key %s)", d.file, cm, key), []byte(text), siblings); err != nil {
		p.add("%v", err)
	}
	sc, err := parseSidecarConfig([]byte(text))
	if err != nil {
		p.add("%s: ConfigMap %s key %s: %v", name, cm, key, err)
		return nil, 0
	}
	if err := sc.loadDomains(siblings); err != nil {
		p.add("%s: ConfigMap %s key %s: %v", name, cm, key, err)
	}

	env := map[string]*corev1.EnvVar{}
	for i := range c.Env {
		env[c.Env[i].Name] = &c.Env[i]
	}
	// The environment wins over the file, as in extauthz serve.
	if e := env["EXTAUTHZ_LISTEN_GRPC"]; e != nil && e.Value != "" {
		sc.Listen.GRPC = e.Value
	}
	if e := env["EXTAUTHZ_LISTEN_ADMIN"]; e != nil && e.Value != "" {
		sc.Listen.Admin = e.Value
	}
	fromField := func(n, path string) {
		if e := env[n]; e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path {
			p.add("%s: env %s must come from the downward API (fieldRef %s)", name, n, path)
		}
	}
	fromResource := func(n, res string) {
		if e := env[n]; e == nil || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil || e.ValueFrom.ResourceFieldRef.Resource != res {
			p.add("%s: env %s must come from the downward API (resourceFieldRef %s)", name, n, res)
		}
	}
	fromField("EXTAUTHZ_REPLICA_ID", "metadata.name")
	fromResource("GOMAXPROCS", "limits.cpu")
	fromResource("GOMEMLIMIT", "limits.memory")
	if sc.Redis != nil && sc.Redis.PasswordEnv != "" {
		if e := env[sc.Redis.PasswordEnv]; e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			p.add("%s: redis.password_env is %s, which must come from a Secret (secretKeyRef)", name, sc.Redis.PasswordEnv)
		}
	}
	if sc.Redis != nil && sc.Redis.Sentinel != nil && sc.Redis.Sentinel.PasswordEnv != "" {
		if e := env[sc.Redis.Sentinel.PasswordEnv]; e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			p.add("%s: redis.sentinel.password_env is %s, which must come from a Secret (secretKeyRef)", name, sc.Redis.Sentinel.PasswordEnv)
		}
	}
	for _, e := range c.Env {
		if e.Value != "" && strings.Contains(strings.ToUpper(e.Name), "PASSWORD") {
			p.add("%s: env %s has a literal value: use a Secret", name, e.Name)
		}
	}

	grpcL, err := sc.grpcEndpoint()
	if err != nil {
		p.add("%s: listen.grpc: %v", name, err)
		return sc, 0
	}
	adminL, err := parseListen(sc.Listen.Admin)
	if err != nil {
		p.add("%s: listen.admin: %v", name, err)
		return sc, 0
	}
	listeners := map[int32]grpcEndpoint{}
	for _, l := range []grpcEndpoint{grpcL, adminL} {
		if l.unix != "" {
			continue
		}
		listeners[int32(l.port)] = l
		if _, ok := resolvePort([]corev1.Container{*c}, nil, intstr.FromInt32(int32(l.port))); !ok {
			p.add("%s: extauthz listens on port %d, which the container does not declare", name, l.port)
		}
	}
	if !alone && grpcL.unix == "" && !grpcL.isLoopback() {
		// Check believes what its caller says (the client address,
		// principal and claims): beside its proxy, nothing else may reach
		// it, and a NetworkPolicy cannot promise that (some CNIs do not
		// enforce it, host-network pods bypass it).
		p.add("%s: listen.grpc %s: beside its proxy in the pod, extauthz must listen on loopback (or a unix socket), not rely on a NetworkPolicy", name, sc.Listen.GRPC)
	}
	// Readiness must follow draining: /readyz on the admin port, or the
	// gRPC health of the Authorization service where the kubelet can reach
	// the Check port.
	switch rp := c.ReadinessProbe; {
	case rp != nil && rp.HTTPGet != nil:
		if port, ok := probePort(c, rp); !ok || uint32(port) != adminL.port || rp.HTTPGet.Path != "/readyz" {
			p.add("%s: readinessProbe must be httpGet /readyz on the admin port %d: it answers 503 while draining", name, adminL.port)
		}
	case rp != nil && rp.GRPC != nil:
		if uint32(rp.GRPC.Port) != grpcL.port {
			p.add("%s: a gRPC readinessProbe must ask the Check port %d", name, grpcL.port)
		} else if svc := rp.GRPC.Service; svc == nil || *svc != grpcHealthService {
			p.add("%s: readinessProbe should ask for service %s: it goes NOT_SERVING while draining", name, grpcHealthService)
		}
	default:
		p.add("%s: readinessProbe must be httpGet /readyz on the admin port %d (or, where the Check port is reachable, a gRPC probe of it)", name, adminL.port)
	}
	if c.LivenessProbe == nil {
		p.add("%s: no livenessProbe", name)
	}
	for _, pr := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
		if pr == nil {
			continue
		}
		port, ok := probePort(c, pr)
		if !ok {
			continue // reported by checkContainer
		}
		l, ok := listeners[port]
		switch {
		case !ok:
			p.add("%s: a probe connects to port %d, where extauthz does not listen", name, port)
		case l.isLoopback():
			p.add("%s: a probe connects to port %d, but extauthz listens there on %s only; the kubelet connects to the pod IP", name, port, l.host)
		}
	}
	return sc, int32(grpcL.port)
}

// checkEnvoyContainer checks the Envoy container and its bootstrap against
// the pod: the bootstrap it loads, the extauthz beside it, declared ports.
func checkEnvoyContainer(p *problems, s *set, d *object, spec *corev1.PodSpec, volumes map[string]*corev1.Volume, c *corev1.Container, sc *sidecarConfig) *bootstrapv3.Bootstrap {
	name := fmt.Sprintf("%s: container %s", d, c.Name)
	args := append(append([]string{}, c.Command...), c.Args...)
	file, ok := flagValue(args, "c", "config-path")
	if !ok {
		p.add("%s: no -c: which bootstrap does Envoy load?", name)
		return nil
	}
	if _, ok := flagValue(args, "concurrency"); !ok {
		p.add("%s: no --concurrency: Envoy would start a worker per node core, not per its CPU limit", name)
	}
	cm, key, text, err := mountedConfigMap(s, volumes, c, file)
	if err != nil {
		p.add("%s: %v", name, err)
		return nil
	}
	where := fmt.Sprintf("%s (ConfigMap %s key %s)", d.file, cm, key)
	b, err := loadBootstrap([]byte(text))
	if err != nil {
		p.add("%s: %v", where, err)
		return nil
	}
	if sc == nil {
		p.add("%s: Envoy has no extauthz container beside it", name)
		return b
	}
	checkBootstrap(p, where, []byte(text), b, sc)
	// The overload manager must act before the kubelet's OOM killer does.
	if heap, limit := fixedHeapBytes(b), c.Resources.Limits.Memory().Value(); heap > 0 && limit > 0 && int64(heap) >= limit {
		p.add("%s: overload manager max_heap_size_bytes %d is not below the container's memory limit %d: the OOM killer acts first", where, heap, limit)
	}

	for _, l := range b.GetStaticResources().GetListeners() {
		port := int32(l.GetAddress().GetSocketAddress().GetPortValue())
		if _, ok := resolvePort([]corev1.Container{*c}, nil, intstr.FromInt32(port)); !ok {
			p.add("%s: Envoy listener %s on port %d is not a declared container port", name, l.GetName(), port)
		}
	}
	// Clusters on loopback reach containers in this pod: each must be one,
	// but for the one that reaches Envoy's own admin listener (the metrics
	// listener's), which is not a container port.
	admin := adminCluster(b)
	for _, cl := range b.GetStaticResources().GetClusters() {
		if cl == admin {
			continue
		}
		for _, sa := range socketAddresses(cl) {
			if sa.GetAddress() != "127.0.0.1" && sa.GetAddress() != "::1" && sa.GetAddress() != "localhost" {
				continue
			}
			port := intstr.FromInt32(int32(sa.GetPortValue()))
			if _, ok := resolvePort(spec.Containers, spec.InitContainers, port); !ok {
				p.add("%s: cluster %s goes to %s:%d, which no container in the pod declares", where, cl.GetName(), sa.GetAddress(), sa.GetPortValue())
			}
		}
	}
	return b
}

// checkIsolation checks that extauthz's Check port is reachable only by
// those meant to call it. Check believes what it is told (the caller's
// address, principal and claims). An extauthz beside its proxy listens on
// loopback (checkExtauthzContainer). A shared one is reached over the
// network, so its callers must prove who they are (mTLS, which Istio's
// STRICT PeerAuthentication requires) and be named: an ALLOW policy
// listing the namespaces or principals that use it, never any caller.
func checkIsolation(p *problems, s *set) {
	for _, pod := range s.pods {
		if pod.extauthz == nil || !pod.alone {
			continue
		}
		l, err := pod.extauthz.grpcEndpoint()
		if err != nil || l.isLoopback() || l.unix != "" {
			continue
		}
		if !strictMTLS(s, pod.labels, pod.grpcPort) {
			p.add("Deployment %s: a shared extauthz needs mTLS on its gRPC port %d: an Istio PeerAuthentication in STRICT mode selecting it", pod.deployment, pod.grpcPort)
		}
		if !hasAllowPolicy(s, pod.labels) {
			p.add("Deployment %s: a shared extauthz needs an Istio ALLOW AuthorizationPolicy saying who may call it", pod.deployment)
		}
		for _, msg := range openAllowRules(s, pod.labels, pod.grpcPort) {
			p.add("Deployment %s: %s", pod.deployment, msg)
		}
	}
}
