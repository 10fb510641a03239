package grpcserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-sched/sluice/admission"
)

// invalidArgument returns an INVALID_ARGUMENT status whose message is
// "invalid <field>: <reason>" and whose google.rpc.BadRequest detail names
// the field.
func invalidArgument(field, reason string) error {
	ia := admission.InvalidArgumentError{Field: field, Reason: reason}
	st := status.New(codes.InvalidArgument, ia.Error())
	withDetail, err := st.WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: reason}},
	})
	if err != nil {
		// Only a detail that cannot be marshalled (invalid UTF-8) gets here.
		return st.Err()
	}
	return withDetail.Err()
}

// statusFromError maps an engine error to a gRPC status error (see the
// package documentation for the table).
func statusFromError(err error) error {
	var ia *admission.InvalidArgumentError
	switch {
	case errors.As(err, &ia) && ia != nil:
		return invalidArgument(ia.Field, ia.Reason)
	case errors.Is(err, admission.ErrNotYourLease):
		// Another tenant's lease is answered as a dead one, word for word:
		// a caller learns nothing of leases it may not release, not even
		// that one is live, as GitHub's API answers 404 for a private
		// repository. (A dead id names no tenant, so PERMISSION_DENIED for
		// both cannot be had.) The engine's error keeps the difference.
		return status.Error(codes.NotFound, admission.ErrLeaseNotFound.Error())
	case errors.Is(err, admission.ErrLeaseNotFound), errors.Is(err, admission.ErrUnknownDomain):
		return status.Error(codes.NotFound, errorText(err))
	case errors.Is(err, admission.ErrLeaseEnded):
		return status.Error(codes.FailedPrecondition, errorText(err))
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, errorText(err))
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, errorText(err))
	}
	text := errorText(err)
	slog.Error("admission engine failed", "err", text)
	return status.Error(codes.Internal, "internal error: "+text)
}

// errorText is err.Error(), except that an Error method that panics (say,
// on a typed nil pointer) yields fmt's rendering instead of a panic.
func errorText(err error) string {
	return fmt.Sprint(err)
}

// RecoveryUnaryInterceptor returns a unary server interceptor that turns a
// panic in a handler into an INTERNAL error and logs it, with the method and
// the stack, on logger (slog.Default() when nil). The server keeps serving.
func RecoveryUnaryInterceptor(logger *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				l := logger
				if l == nil {
					l = slog.Default()
				}
				l.ErrorContext(ctx, "gRPC handler panicked",
					"method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
				resp, err = nil, status.Error(codes.Internal, "internal error")
			}
		}()
		return handler(ctx, req)
	}
}
