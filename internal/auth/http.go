package auth

import (
	"errors"
	"net/http"
)

// HTTP wraps next so that only a principal holding role reaches it: no
// credential (or an unknown one) is 401 with a WWW-Authenticate challenge,
// a principal without the role is 403. Credentials are read as on gRPC: a
// bearer token (over plaintext only from loopback) or the verified client
// certificate. An open Authenticator passes every request through.
func (a *Authenticator) HTTP(role Role, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.Open() {
			next.ServeHTTP(w, r)
			return
		}
		p, err := a.Identify(httpCredentials(r))
		switch {
		case errors.Is(err, ErrUnauthenticated):
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluiced"`)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		case err != nil:
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		case !p.Has(role):
			http.Error(w, "principal "+p.Name+" needs the "+string(role)+" role", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), p)))
	})
}

// httpCredentials reads what an HTTP request presented.
func httpCredentials(r *http.Request) Credentials {
	var c Credentials
	if vs := r.Header.Values("Authorization"); len(vs) > 0 {
		c.HasAuthorization = true
		c.Bearer = parseBearer(vs[0])
	}
	c.Loopback = isLoopbackHostPort(r.RemoteAddr)
	if r.TLS != nil {
		c.TLS = true
		if chains := r.TLS.VerifiedChains; len(chains) > 0 && len(chains[0]) > 0 {
			c.Cert = chains[0][0]
		}
	}
	return c
}

// IdentifyHTTP returns the principal an HTTP request presents, read as HTTP
// reads it (a bearer token over TLS or from loopback, or the verified client
// certificate): for a handler that decides by itself what a principal may
// do and audits refusals (the dashboard's actions). An open Authenticator
// returns nil and no error; no credential, or an unknown one, is an error
// wrapping ErrUnauthenticated.
func (a *Authenticator) IdentifyHTTP(r *http.Request) (*Principal, error) {
	if a.Open() {
		return nil, nil
	}
	return a.Identify(httpCredentials(r))
}
