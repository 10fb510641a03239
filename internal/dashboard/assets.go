package dashboard

import (
	"embed"
	"net/http"
)

// assets are the page, its script and its style sheet: everything the
// browser loads, so that the dashboard works with no network beyond sluiced.
//
//go:embed assets/index.html assets/app.js assets/style.css
var assets embed.FS

// assetTypes are the files served under /assets/ and their types; nothing
// else in the embedded tree is.
var assetTypes = map[string]string{
	"app.js":    "text/javascript; charset=utf-8",
	"style.css": "text/css; charset=utf-8",
}

// contentSecurityPolicy lets the page load only its own script, style and
// API: no inline script, nothing from elsewhere, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// serveIndex serves the page.
func serveIndex(w http.ResponseWriter, _ *http.Request) {
	serveAsset(w, "index.html", "text/html; charset=utf-8")
}

// assetHandler serves the script and style sheet by name.
func assetHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Path[len("/assets/"):]
		typ, ok := assetTypes[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		serveAsset(w, name, typ)
	})
}

func serveAsset(w http.ResponseWriter, name, typ string) {
	b, err := assets.ReadFile("assets/" + name)
	if err != nil { // the names are fixed and embedded: a build defect
		http.Error(w, "asset missing", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", typ)
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	// The script and style change only with the binary: five minutes of
	// caching bounds how long a browser runs an old one after an upgrade,
	// and the page itself is always revalidated.
	if name == "index.html" {
		h.Set("Cache-Control", "no-cache")
	} else {
		h.Set("Cache-Control", "max-age=300")
	}
	_, _ = w.Write(b)
}
