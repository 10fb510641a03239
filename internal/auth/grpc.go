package auth

import (
	"context"
	"errors"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// access is what a method asks of its caller.
type access int

const (
	accessDenied        access = iota // no role grants it (a method the table does not know)
	accessOpen                        // anybody, unauthenticated (health)
	accessAuthenticated               // any principal (reflection)
	accessRouter                      // the router role, bound to the request's tenant
	accessViewer                      // the viewer role (or operator)
	accessOperator                    // the operator role
	accessGateway                     // the gateway role, trusted with every tenant
)

// Method names of the services that are not Sluice's.
const (
	reflectionV1      = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
	reflectionV1Alpha = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
)

// methodAccess is who may call each method sluiced serves. A method missing
// here is refused to everybody: a new RPC is closed until it is added.
var methodAccess = map[string]access{
	admissionv1.Admission_Admit_FullMethodName:   accessRouter,
	admissionv1.Admission_Release_FullMethodName: accessRouter,
	// A worker claims deferred work as a router; its tickets' tenants are
	// known only to the backlog, which asks CheckTenant.
	admissionv1.Admission_Claim_FullMethodName:        accessRouter,
	admissionv1.Admission_GetTicket_FullMethodName:    accessRouter,
	admissionv1.Admission_CancelTicket_FullMethodName: accessRouter,
	// Envoy's rate-limit protocol decides as Admit does; its tenants are
	// inside the descriptors, so the handler checks them (CheckTenant).
	rlsv3.RateLimitService_ShouldRateLimit_FullMethodName: accessRouter,
	// Envoy's external processing names the tenant in a header the
	// gateway sets after authenticating its caller: only a gateway may.
	extprocv3.ExternalProcessor_Process_FullMethodName:    accessGateway,
	admissionv1.Operator_ListDomains_FullMethodName:       accessViewer,
	admissionv1.Operator_ListTenants_FullMethodName:       accessViewer,
	admissionv1.Operator_GetTenant_FullMethodName:         accessViewer,
	admissionv1.Operator_GetConfigStatus_FullMethodName:   accessViewer,
	admissionv1.Operator_ExplainAdmit_FullMethodName:      accessViewer,
	admissionv1.Operator_ListBacklog_FullMethodName:       accessViewer,
	admissionv1.Operator_DrainDomain_FullMethodName:       accessOperator,
	admissionv1.Operator_UndrainDomain_FullMethodName:     accessOperator,
	admissionv1.Operator_FreezeBurstCredit_FullMethodName: accessOperator,
	admissionv1.Operator_ThawBurstCredit_FullMethodName:   accessOperator,
	healthpb.Health_Check_FullMethodName:                  accessOpen,
	healthpb.Health_Watch_FullMethodName:                  accessOpen,
	healthpb.Health_List_FullMethodName:                   accessOpen,
	reflectionV1:                                          accessAuthenticated,
	reflectionV1Alpha:                                     accessAuthenticated,
}

// operatorService prefixes the Operator's methods: every refused call to
// one is audited, and so is every write (auditedWrites).
var operatorService = "/" + admissionv1.Operator_ServiceDesc.ServiceName + "/"

// auditedWrites are the methods audited whatever their outcome.
var auditedWrites = map[string]bool{
	admissionv1.Operator_DrainDomain_FullMethodName:       true,
	admissionv1.Operator_UndrainDomain_FullMethodName:     true,
	admissionv1.Operator_FreezeBurstCredit_FullMethodName: true,
	admissionv1.Operator_ThawBurstCredit_FullMethodName:   true,
}

// principalKey keys the caller's principal in a context.
type principalKey struct{}

// NewContext returns ctx carrying p, as the interceptors pass the caller to
// handlers.
func NewContext(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal the interceptors identified; false when
// there is none (no auth file: every caller is allowed).
func FromContext(ctx context.Context) (*Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(*Principal)
	return p, ok && p != nil
}

// CheckTenant is the check a handler makes when it learns a tenant the
// interceptor could not see (the tenant of a lease being released): nil when
// the caller in ctx may act for tenant, or when no auth file is in use;
// otherwise a PERMISSION_DENIED status. grpcserver.WithTenantGuard takes it.
func CheckTenant(ctx context.Context, tenant string) error {
	p, ok := FromContext(ctx)
	if !ok {
		if _, authed := ctx.Value(authedKey{}).(bool); authed {
			// An authenticated server with no principal in the context:
			// the handler was reached some way the interceptor did not
			// see. Refuse rather than allow.
			return status.Error(codes.PermissionDenied, "no principal for this call")
		}
		return nil
	}
	if !p.MayServe(tenant) {
		return status.Errorf(codes.PermissionDenied, "principal %q is not bound to tenant %q", p.Name, clip(tenant, 128))
	}
	return nil
}

// authedKey marks a context as served by an Authenticator with an auth file.
type authedKey struct{}

// grpcCredentials reads what the caller presented on this RPC.
func grpcCredentials(ctx context.Context) Credentials {
	var c Credentials
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if vs := md.Get("authorization"); len(vs) > 0 {
			c.HasAuthorization = true
			c.Bearer = parseBearer(vs[0])
		}
	}
	if p, ok := peer.FromContext(ctx); ok {
		c.Loopback = isLoopback(p.Addr)
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			c.TLS = true
			if chains := ti.State.VerifiedChains; len(chains) > 0 && len(chains[0]) > 0 {
				c.Cert = chains[0][0]
			}
		}
	}
	return c
}

// peerAddr is the caller's address, for the audit log.
func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// authorize decides one call; it returns the caller (nil when open) and a
// status error when the call is refused.
func (a *Authenticator) authorize(ctx context.Context, method string, req any) (*Principal, error) {
	acc := methodAccess[method]
	if acc == accessOpen || a.Open() {
		return nil, nil // nothing to read from the call: most calls on an open server
	}
	p, _ := ctx.Value(tappedKey{}).(*Principal)
	if p == nil {
		var err error
		if p, err = a.Identify(grpcCredentials(ctx)); err != nil {
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
	}
	switch acc {
	case accessAuthenticated:
		return p, nil
	case accessRouter:
		if !p.Has(RoleRouter) {
			return p, denied(p, method, RoleRouter)
		}
		// Admit names its tenant; Release's lease names one only the engine
		// knows, and an RLS request's descriptors name any number, so those
		// handlers call CheckTenant themselves.
		if t, ok := req.(interface{ GetTenant() string }); ok && !p.MayServe(t.GetTenant()) {
			return p, status.Errorf(codes.PermissionDenied, "principal %q is not bound to tenant %q", p.Name, clip(t.GetTenant(), 128))
		}
		return p, nil
	case accessViewer:
		if !p.Has(RoleViewer) {
			return p, denied(p, method, RoleViewer)
		}
		return p, nil
	case accessOperator:
		if !p.Has(RoleOperator) {
			return p, denied(p, method, RoleOperator)
		}
		return p, nil
	case accessGateway:
		if !p.Has(RoleGateway) {
			return p, denied(p, method, RoleGateway)
		}
		return p, nil
	}
	return p, status.Errorf(codes.PermissionDenied, "%s is open to no role", method)
}

// tappedKey keys the principal TapHandle identified in a call's context.
type tappedKey struct{}

// TapHandle returns the check grpc.InTapHandle runs on a call's headers,
// before the transport starts the call: a call that needs a principal and
// presents no credential naming one is refused UNAUTHENTICATED there, at
// the cost of its HEADERS frame, rather than after its request message
// arrives (a unary call's interceptors run only then, and a stream that
// never sends one would hold its goroutine). A refused Operator call is
// audited, without the target its unread request names. The interceptors
// decide the role and tenant of every call that passes, with the
// principal found here.
func (a *Authenticator) TapHandle() tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if a.Open() || methodAccess[info.FullMethodName] == accessOpen {
			return ctx, nil
		}
		p, err := a.Identify(grpcCredentials(ctx))
		if err != nil {
			err = status.Error(codes.Unauthenticated, err.Error())
			if strings.HasPrefix(info.FullMethodName, operatorService) {
				a.auditCall(ctx, info.FullMethodName, nil, nil, err)
			}
			return ctx, err
		}
		return context.WithValue(ctx, tappedKey{}, p), nil
	}
}

// denied is the PERMISSION_DENIED answer to p calling method without role.
func denied(p *Principal, method string, role Role) error {
	return status.Errorf(codes.PermissionDenied, "principal %q may not call %s: it needs the %s role", p.Name, method, role)
}

// UnaryServerInterceptor returns the interceptor that authorises every unary
// call, passes the caller to the handler (FromContext) and audits operator
// actions. Put it before any interceptor that acts on the request.
func (a *Authenticator) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, err := a.authorize(ctx, info.FullMethod, req)
		operator := strings.HasPrefix(info.FullMethod, operatorService)
		if err != nil {
			if operator {
				a.auditCall(ctx, info.FullMethod, p, req, err)
			}
			return nil, err
		}
		if !a.Open() {
			ctx = context.WithValue(ctx, authedKey{}, true)
		}
		if p != nil {
			ctx = NewContext(ctx, p)
		}
		resp, err := handler(ctx, req)
		if auditedWrites[info.FullMethod] {
			a.auditCall(ctx, info.FullMethod, p, req, err)
		}
		return resp, err
	}
}

// StreamServerInterceptor returns the interceptor that authorises every
// streaming call (health Watch, reflection, Admission/Claim). No request
// is inspected: Claim names its tenants in its first message, which its
// handler checks against the principal the interceptor puts in the
// stream's context.
func (a *Authenticator) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, err := a.authorize(ss.Context(), info.FullMethod, nil)
		if err != nil {
			if strings.HasPrefix(info.FullMethod, operatorService) {
				a.auditCall(ss.Context(), info.FullMethod, p, nil, err)
			}
			return err
		}
		// The handler sees the principal as a unary one does: the
		// Claim stream checks its tickets' tenants with CheckTenant.
		ctx := ss.Context()
		if !a.Open() {
			ctx = context.WithValue(ctx, authedKey{}, true)
		}
		if p != nil {
			ctx = NewContext(ctx, p)
		}
		return handler(srv, contextStream{ss, ctx})
	}
}

// contextStream is a server stream with its handler's context.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

// Context returns the stream's context, with the caller's principal.
func (s contextStream) Context() context.Context { return s.ctx }

// auditCall records one Operator call: its principal, the domain or tenant
// it named, the reason it gave, and how it ended.
func (a *Authenticator) auditCall(ctx context.Context, method string, p *Principal, req any, err error) {
	if a.audit == nil {
		return
	}
	e := Event{Principal: principalName(p, a.Open()), Peer: peerAddr(ctx), Action: method[strings.LastIndexByte(method, '/')+1:], Err: err}
	switch r := req.(type) {
	case interface{ GetDomain() string }:
		e.Target = r.GetDomain()
	case interface{ GetName() string }:
		e.Target = r.GetName()
	case *admissionv1.FreezeBurstCreditRequest:
		// Every tenant's credit is the target; the length is what an
		// auditor asks next.
		e.Target = "burst credit for " + r.GetDuration().AsDuration().String()
	case *admissionv1.ThawBurstCreditRequest:
		e.Target = "burst credit"
	}
	if r, ok := req.(interface{ GetReason() string }); ok {
		e.Reason = r.GetReason()
	}
	e.Outcome = outcomeOf(err)
	a.audit.Record(ctx, e)
}

// principalName names p in an audit line.
func principalName(p *Principal, open bool) string {
	switch {
	case p != nil:
		return p.Name
	case open:
		return "anonymous"
	}
	return "unauthenticated"
}

// outcomeOf maps a call's error to an audit outcome.
func outcomeOf(err error) string {
	if err == nil {
		return OutcomeOK
	}
	switch status.Code(err) {
	case codes.Unauthenticated:
		return OutcomeUnauthenticated
	case codes.PermissionDenied:
		return OutcomeDenied
	}
	if errors.Is(err, ErrUnauthenticated) {
		return OutcomeUnauthenticated
	}
	return OutcomeFailed
}
