// Package extproc serves Envoy's external processing protocol (ext_proc
// v3) as the endpoint picker of the Gateway API Inference Extension: for
// each HTTP request Envoy streams, the request lifecycle of package
// gateway decides, and the answer tells Envoy where to send the request
// (x-gateway-destination-endpoint, and the same value in the dynamic
// metadata namespace envoy.lb) or answers the client at once.
//
// A stream goes as follows. Request headers: read; in BUFFERED mode
// answered at once, in FULL_DUPLEX_STREAMED (the default) held until the
// body is whole, since the endpoint depends on the body. A request without
// a body is answered on its headers. Request body: gathered to its end,
// then decided (waiting in the fair queue while the stream is held);
// granted, the headers answer sets the destination and the corrected
// content-length and clears the route cache, and the body follows in
// chunks of at most MaxChunk bytes (in BUFFERED mode the body answer
// carries it all); refused, an ImmediateResponse. Response headers and
// body: passed on at once, each chunk read for the time to first token and
// the usage; the end of the response, or of the stream, releases the lease.
package extproc

import (
	"errors"
	"io"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sluice-sched/sluice/internal/gateway"
)

// The Endpoint Picker Protocol's names.
const (
	// DestinationHeader names the endpoint (host:port) Envoy is to send
	// the request to.
	DestinationHeader = "x-gateway-destination-endpoint"
	// MetadataNamespace holds, under DestinationHeader, the endpoint and
	// its fallbacks of the same domain, comma-separated, for an Envoy
	// load balancer that picks from it.
	MetadataNamespace = "envoy.lb"
	// SubsetNamespace and SubsetKey are where Envoy puts the endpoints a
	// request may go to (its subset hint), as a list of host:port.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// MaxChunk bounds one streamed body chunk: Envoy's ext_proc messages
	// stay under its default 64 KiB gRPC frame with room for the envelope.
	MaxChunk = 62000
)

// ServiceName is the gRPC service, for health checks.
const ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"

// Options configure the processor.
type Options struct {
	// RequestBodyMode is the mode assumed when Envoy's stream does not say
	// (protocol_config arrives from Envoy 1.34 on); 0: FULL_DUPLEX_STREAMED.
	RequestBodyMode filterv3.ProcessingMode_BodySendMode
}

// Server implements extprocv3.ExternalProcessorServer over a Gateway.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	gw *gateway.Gateway
	o  Options
}

// Register serves the processor on s.
func Register(s *grpc.Server, gw *gateway.Gateway, o Options) *Server {
	if o.RequestBodyMode == filterv3.ProcessingMode_NONE {
		o.RequestBodyMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	srv := &Server{gw: gw, o: o}
	extprocv3.RegisterExternalProcessorServer(s, srv)
	return srv
}

// stream is one Process call's state.
type stream struct {
	s        *Server
	ps       extprocv3.ExternalProcessor_ProcessServer
	x        *gateway.Exchange
	reqMode  filterv3.ProcessingMode_BodySendMode
	respMode filterv3.ProcessingMode_BodySendMode
	decided  bool
}

// Process implements extprocv3.ExternalProcessorServer: one HTTP request.
func (s *Server) Process(ps extprocv3.ExternalProcessor_ProcessServer) error {
	st := &stream{s: s, ps: ps, x: s.gw.Start(), reqMode: s.o.RequestBodyMode, respMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	// Whatever ends the stream (Envoy's cancel, a reset, an error here)
	// releases a lease still held; after the response's end it does nothing.
	defer st.x.Abort(gateway.OutcomeClientCancel)
	for {
		req, err := ps.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || ps.Context().Err() != nil {
				return nil
			}
			return err
		}
		done, err := st.handle(req)
		if err != nil || done {
			return err
		}
	}
}

// handle answers one message; done: the stream has nothing more to say.
func (st *stream) handle(req *extprocv3.ProcessingRequest) (done bool, err error) {
	if pc := req.GetProtocolConfig(); pc != nil {
		st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		h := r.ResponseHeaders
		code, _ := strconv.Atoi(header(h.GetHeaders(), ":status"))
		st.x.ResponseHeaders(code, header(h.GetHeaders(), "content-type"))
		if h.GetEndOfStream() {
			st.x.Done()
		}
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseBody:
		return false, st.responseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.x.Done()
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return false, status.Error(codes.InvalidArgument, "processing request: no request, headers, body or trailers")
}

func (st *stream) requestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	hm := h.GetHeaders()
	if v := st.x.RequestHeaders(header(hm, ":path"), func(name string) string { return header(hm, name) }); v != nil {
		return true, st.immediate(v)
	}
	if subset, ok := subsetHint(req); ok {
		st.x.SetSubset(subset)
	}
	if h.GetEndOfStream() { // no body: decided on the headers
		return st.decide(false)
	}
	if st.reqMode == filterv3.ProcessingMode_BUFFERED || st.reqMode == filterv3.ProcessingMode_BUFFERED_PARTIAL {
		// Envoy waits for this answer before it sends the body; the
		// destination goes with the body's answer.
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
	}
	return false, nil
}

func (st *stream) requestBody(b *extprocv3.HttpBody) (bool, error) {
	if st.decided {
		return false, status.Error(codes.FailedPrecondition, "request body after the request's end")
	}
	if v := st.x.AppendBody(b.GetBody()); v != nil {
		return true, st.immediate(v)
	}
	if !b.GetEndOfStream() {
		return false, nil
	}
	return st.decide(true)
}

// decide runs the decision and sends its answer.
func (st *stream) decide(hasBody bool) (bool, error) {
	st.decided = true
	v := st.x.Decide(st.ps.Context())
	if v.Status == 499 { // the stream is gone: nobody to answer
		return true, nil
	}
	if !v.Forward() {
		return true, st.immediate(&v)
	}
	// The header names one endpoint (an ORIGINAL_DST cluster reads it as
	// host:port); the metadata lists the fallbacks after it, for a load
	// balancer that retries.
	dest := v.Endpoint
	if len(v.Fallbacks) > 0 {
		dest += "," + strings.Join(v.Fallbacks, ",")
	}
	set := []*corev3.HeaderValueOption{setHeader(DestinationHeader, v.Endpoint)}
	if hasBody {
		set = append(set, setHeader("content-length", strconv.Itoa(len(v.Body))))
	}
	if v.Domain != "" {
		set = append(set, setHeader("x-sluice-domain", v.Domain), setHeader("x-sluice-model", v.Model))
	}
	common := &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}, ClearRouteCache: true}
	buffered := st.reqMode == filterv3.ProcessingMode_BUFFERED || st.reqMode == filterv3.ProcessingMode_BUFFERED_PARTIAL
	if hasBody && buffered {
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: v.Body}}
		resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}}
		setDestinationMetadata(resp, dest)
		return false, st.send(resp)
	}
	resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}
	setDestinationMetadata(resp, dest)
	if err := st.send(resp); err != nil {
		return true, err
	}
	if !hasBody {
		return false, nil
	}
	body := v.Body
	for {
		n := min(len(body), MaxChunk)
		last := n == len(body)
		if err := st.send(streamedBody(body[:n], last, true)); err != nil {
			return true, err
		}
		body = body[n:]
		if last {
			return false, nil
		}
	}
}

func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	in := b.GetBody()
	out := st.x.ResponseBody(in, b.GetEndOfStream())
	if st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return st.send(streamedBody(out, b.GetEndOfStream(), false))
	}
	resp := &extprocv3.BodyResponse{}
	if len(out) != len(in) {
		resp.Response = &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}}
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: resp}})
}

// immediate answers the client without an upstream.
func (st *stream) immediate(v *gateway.Verdict) error {
	set := make([]*corev3.HeaderValueOption, 0, len(v.Headers))
	for _, h := range v.Headers {
		set = append(set, setHeader(h[0], h[1]))
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(v.Status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: set},
		Body:    v.Body,
		Details: "sluice: " + v.Message,
	}}})
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if err := st.ps.Send(r); err != nil {
		return err
	}
	return nil
}

// chunkAnswer is the messages of one streamed body chunk's answer, in one
// allocation: twenty of them answer a streamed response.
type chunkAnswer struct {
	resp     extprocv3.ProcessingResponse
	reqBody  extprocv3.ProcessingResponse_RequestBody
	respBody extprocv3.ProcessingResponse_ResponseBody
	body     extprocv3.BodyResponse
	common   extprocv3.CommonResponse
	mutation extprocv3.BodyMutation
	streamed extprocv3.BodyMutation_StreamedResponse
	chunk    extprocv3.StreamedBodyResponse
}

// streamedBody is one chunk of a FULL_DUPLEX_STREAMED body.
func streamedBody(b []byte, end, request bool) *extprocv3.ProcessingResponse {
	a := &chunkAnswer{}
	a.chunk.Body, a.chunk.EndOfStream = b, end
	a.streamed.StreamedResponse = &a.chunk
	a.mutation.Mutation = &a.streamed
	a.common.BodyMutation = &a.mutation
	a.body.Response = &a.common
	if request {
		a.reqBody.RequestBody = &a.body
		a.resp.Response = &a.reqBody
	} else {
		a.respBody.ResponseBody = &a.body
		a.resp.Response = &a.respBody
	}
	return &a.resp
}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}

// The field numbers of the dynamic metadata as written on the wire.
var (
	dynamicMetadataField = (&extprocv3.ProcessingResponse{}).ProtoReflect().Descriptor().Fields().ByName("dynamic_metadata").Number()
	structFieldsField    = (&structpb.Struct{}).ProtoReflect().Descriptor().Fields().ByName("fields").Number()
	valueStructField     = (&structpb.Value{}).ProtoReflect().Descriptor().Fields().ByName("struct_value").Number()
	valueStringField     = (&structpb.Value{}).ProtoReflect().Descriptor().Fields().ByName("string_value").Number()
)

// setDestinationMetadata puts the envoy.lb namespace naming dest in r as
// its encoded dynamic_metadata field, in one allocation: protobuf encodes
// a Struct's maps by reflection, at some microseconds an answer, where
// these few bytes cost next to nothing. Envoy (and any reader) decodes it
// as the field itself.
func setDestinationMetadata(r *extprocv3.ProcessingResponse, dest string) {
	// Struct{fields: {envoy.lb: Value{struct_value: Struct{fields:
	// {x-gateway-destination-endpoint: Value{string_value: dest}}}}}};
	// a map entry is a message of key (1) and value (2). Each length
	// prefix is the size of what follows it.
	value := protowire.SizeTag(valueStringField) + protowire.SizeBytes(len(dest))
	entry := protowire.SizeTag(1) + protowire.SizeBytes(len(DestinationHeader)) + protowire.SizeTag(2) + protowire.SizeBytes(value)
	inner := protowire.SizeTag(structFieldsField) + protowire.SizeBytes(entry)
	nsValue := protowire.SizeTag(valueStructField) + protowire.SizeBytes(inner)
	nsEntry := protowire.SizeTag(1) + protowire.SizeBytes(len(MetadataNamespace)) + protowire.SizeTag(2) + protowire.SizeBytes(nsValue)
	outer := protowire.SizeTag(structFieldsField) + protowire.SizeBytes(nsEntry)

	b := make([]byte, 0, protowire.SizeTag(dynamicMetadataField)+protowire.SizeBytes(outer))
	b = appendLen(b, dynamicMetadataField, outer)
	b = appendLen(b, structFieldsField, nsEntry)
	b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), MetadataNamespace)
	b = appendLen(b, 2, nsValue)
	b = appendLen(b, valueStructField, inner)
	b = appendLen(b, structFieldsField, entry)
	b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), DestinationHeader)
	b = appendLen(b, 2, value)
	b = protowire.AppendString(protowire.AppendTag(b, valueStringField, protowire.BytesType), dest)
	m := r.ProtoReflect()
	if u := m.GetUnknown(); len(u) > 0 {
		b = append(u[:len(u):len(u)], b...)
	}
	m.SetUnknown(b)
}

// appendLen appends the tag of field n, of the bytes type, and length:
// the size of the bytes that follow.
func appendLen(b []byte, n protowire.Number, length int) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, n, protowire.BytesType), uint64(length))
}

// header returns the value of the header name (lower case) in hm.
func header(hm *corev3.HeaderMap, name string) string {
	for _, h := range hm.GetHeaders() {
		if strings.EqualFold(h.GetKey(), name) {
			if rv := h.GetRawValue(); len(rv) > 0 {
				return string(rv)
			}
			return h.GetValue()
		}
	}
	return ""
}

// subsetHint reads the endpoints Envoy allows for this request.
func subsetHint(req *extprocv3.ProcessingRequest) ([]string, bool) {
	ns, ok := req.GetMetadataContext().GetFilterMetadata()[SubsetNamespace]
	if !ok {
		return nil, false
	}
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return nil, false
	}
	var out []string
	for _, e := range v.GetListValue().GetValues() {
		if s := e.GetStringValue(); s != "" {
			out = append(out, s)
		}
	}
	return out, true
}

// compile-time check
var _ extprocv3.ExternalProcessorServer = (*Server)(nil)
