// Package admissionv1 is the gRPC wire contract between inference routers and
// sluiced: the Admission service (Admit, Release) and the Operator service
// used by sluicectl. The Go code is generated from admission.proto; edit the
// proto and run go generate, never the .pb.go files.
//
// The enum numbers equal those of package admission (Priority, Outcome as
// Decision, Reason, ReleaseOutcome as Outcome), so converting between them is
// a plain numeric conversion.
package admissionv1

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative admission.proto
