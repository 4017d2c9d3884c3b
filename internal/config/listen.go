package config

// CheckListen reports whether addr is a listen address the configuration
// accepts: host:port, or unix:///path where unixOK. The command line's
// listen overrides (-listen-grpc, $EXTAUTHZ_LISTEN_GRPC) are held to the
// same rules as the file's listen.grpc and listen.admin.
func CheckListen(addr string, unixOK bool) error { return checkListen(addr, unixOK) }
