// Package auth decides who may call sluiced and what they may do, and
// serves sluiced's TLS certificates.
//
// Principals come from an auth file (--auth, YAML or JSON, decoded as
// strictly as the config):
//
//	principals:
//	  - name: router-east
//	    token_sha256: "<hex of sha256(token)>"  # "authorization: Bearer <token>"
//	    roles: [router]
//	    tenants: [acme, globex]                 # or ["*"]
//	  - name: sre
//	    mtls_san: "spiffe://prod/sre"           # a URI SAN, DNS SAN or CN of a verified client certificate
//	    roles: [operator]
//
// A caller is identified by its bearer token when it sends one (compared in
// constant time over the SHA-256, never logged), else by its verified client
// certificate. A bearer token travels in the clear without TLS, so it is
// accepted over plaintext only from a loopback peer.
//
// Roles:
//
//	router    Admission/Admit, Release, Claim, GetTicket and CancelTicket, for its bound tenants only
//	viewer    the Operator's reads (ListDomains, ListTenants, GetTenant, GetConfigStatus, ExplainAdmit, ListBacklog), the HTTP JSON API
//	operator  every Operator RPC (drains included) and every viewer right
//	gateway   Envoy's ext_proc ExternalProcessor/Process, for every tenant (the gateway names it in a trusted header)
//
// No credential, or one that names nobody, is UNAUTHENTICATED; a call outside
// the principal's roles or tenants is PERMISSION_DENIED; the handler does not
// run in either case, so nothing changes. The gRPC health service is open
// (load balancers probe it), reflection needs any principal, and a method
// the table does not know is refused: new RPCs are closed until someone
// decides who may call them.
//
// The auth file and the TLS files are re-read when their contents change
// (Watch polls them; SIGHUP reloads at once). A bad auth file is refused with
// its file, key path and reason and the last good one keeps serving; a file
// that names no principal (empty, as a non-atomic rewrite leaves it for a
// moment) is bad, since it would refuse every caller. A bad certificate pair
// is refused the same way.
//
// Every operator action (drain, undrain, config and auth reloads) and every
// refused Operator call is one audit line and one count of
// sluice_audit_actions_total{action,outcome} (Auditor).
package auth
