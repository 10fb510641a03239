// Package dashboard serves the rack slot dashboard: a web page at "/" that
// draws every NVLink domain in its physical shape (an NVL72 rack as 18 trays
// of 4 GPU slots, an HGX node as 8 slots), each domain's use of its soft
// capacity, its drain mark, and a table of the busiest tenants under a
// header that names the replica, its build and config and carries the fleet
// strip (answers per second, the Admit p99, the commonest refusal reasons),
// kept live over server-sent events; and, behind it, a JSON API under
// /api/v1/. Every time it shows is UTC.
//
// It is an adapter. It reads and acts through the Operator API's own
// handlers (grpcserver.NewOperator), so that a drain from the page is
// validated and answered exactly as DrainDomain over gRPC, and through a
// small State port that sluiced's server satisfies (the cluster it serves,
// the configured tenant names, budgets). Per-tenant answer rates come from
// Traffic, an admission.Observer the server installs beside the metrics one;
// the server also gives it each Admit's latency.
//
// The page, its script and its style sheet are embedded (package embed):
// nothing is fetched from elsewhere, so it works offline and behind an
// air gap. They hold no data and are served to anybody; every byte of data
// comes from /api/v1/, which needs the viewer role, and every action the
// operator role, as the Operator API does. The page sends a bearer token the
// user types (kept in the tab's sessionStorage) or relies on the browser's
// client certificate.
//
// API (field names are the gRPC messages' JSON names, written by protojson;
// the views that have no message use the same lowerCamelCase style):
//
//	GET  /api/v1/domains                         ListDomainsResponse
//	POST /api/v1/domains/{domain}/drain          DrainDomainResponse; body {"reason": "..."} (operator)
//	POST /api/v1/domains/{domain}/undrain        UndrainDomainResponse (operator)
//	GET  /api/v1/topology                        domains → nodes → GPUs, health and NVLink state
//	GET  /api/v1/tenants?page_size=&page_token=  ListTenantsResponse (pages as Operator/ListTenants)
//	GET  /api/v1/tenants/{name}                  GetTenantResponse
//	GET  /api/v1/dashboard?q=&sort=&n=           one snapshot: domains, the tenant table, totals, the fleet strip, the server, the session
//	GET  /api/v1/events?q=&sort=&n=              the same snapshots as server-sent events
//	GET  /api/v1/session                         who is calling and whether they may drain
//
// Actions are POSTs with Content-Type application/json (so that another
// site cannot make a browser send one: a cross-origin JSON POST needs a CORS
// preflight, which is never granted) and are audited as the gRPC ones are
// (action DrainDomain or UndrainDomain, the principal, the peer, the
// domain, the reason, the outcome), refusals included. Without an auth file
// they are off unless the server was started with --dashboard-actions.
// A page of another site that reaches sluiced by DNS rebinding sends its own
// name as the Host, which sluiced's HTTP server refuses before this package
// sees the request (--http-allowed-hosts names the hosts it answers for).
//
// The tenant table never sends every tenant: it shows at most MaxRows
// (default 50) rows, the busiest by answers per second, then the rest in
// name order; a search (q, a substring of the name) and the sort (traffic or
// name) choose which, and the page sorts the rows it has by any column.
package dashboard
