package extproc

import (
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The dynamic metadata written as encoded bytes reads back, on the other
// end of the wire, as the envoy.lb Struct naming the destination, beside
// the rest of the answer.
func TestDestinationMetadataReadsBackAsTheStruct(t *testing.T) {
	for _, dest := range []string{"10.0.0.1:8000", "10.0.0.1:8000,10.0.0.2:8000," + strings.Repeat("10.0.0.3:8000,", 20) + "[::1]:9", "", "é:1"} {
		resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{ClearRouteCache: true}}}}
		setDestinationMetadata(resp, dest)
		raw, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var got extprocv3.ProcessingResponse
		if err := proto.Unmarshal(raw, &got); err != nil {
			t.Fatal(err)
		}
		want := &extprocv3.ProcessingResponse{
			DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
					DestinationHeader: structpb.NewStringValue(dest),
				}}),
			}},
			Response: resp.Response,
		}
		if !proto.Equal(&got, want) {
			t.Errorf("%q: read back as %v, want %v", dest, &got, want)
		}
		if len(got.ProtoReflect().GetUnknown()) != 0 {
			t.Errorf("%q: unknown bytes left: %x", dest, got.ProtoReflect().GetUnknown())
		}
	}
}
