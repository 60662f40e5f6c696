package mediasave

import (
	"mime"
	"net/url"
	"path"
	"regexp"
	"strings"
)

// isSampleHost reports whether host is a name reserved for examples and
// documentation (RFC 2606, RFC 6761): example.com, .net and .org and their
// subdomains, and the .example, .invalid and .test domains. No real media
// is served there; sample call events link to them.
func isSampleHost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, d := range []string{"example.com", "example.net", "example.org", "example", "invalid", "test"} {
		if host == d || strings.HasSuffix(host, "."+d) {
			return true
		}
	}
	return false
}

// extRE is an extension kept from a link: short, and only lowercase
// letters and digits, so that it is harmless in a file name.
var extRE = regexp.MustCompile(`^\.[a-z0-9]{1,5}$`)

// fileExt picks a harmless file extension from the link's path or the
// content type.
func fileExt(link, ctype string) string {
	if u, err := url.Parse(link); err == nil {
		if ext := strings.ToLower(path.Ext(u.Path)); extRE.MatchString(ext) {
			return ext
		}
	}
	mt, _, _ := mime.ParseMediaType(ctype)
	switch mt {
	case "audio/mpeg":
		return ".mp3"
	case "audio/wav", "audio/x-wav", "audio/wave":
		return ".wav"
	case "audio/ogg", "audio/opus":
		return ".ogg"
	case "audio/mp4":
		return ".m4a"
	case "application/json":
		return ".json"
	case "text/plain":
		return ".txt"
	}
	return ".bin"
}
