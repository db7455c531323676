// Package rota is the Go client of rota, a central load-balancing decision service.
//
// Providers register their instances and keep them registered for as long as they should
// receive traffic:
//
//	client, err := rota.Dial(ctx, "127.0.0.1:50051")
//	reg, err := client.Register(ctx, rota.Instance{Service: "orders", Host: "10.0.0.7", Port: 8080})
//	defer reg.Close(context.Background()) // withdraws
//
// Consumers ask rota which instance to call. The rule state (rotation counters) lives in
// rota, so every consumer of a service shares one rotation:
//
//	pick, err := client.Pick(ctx, "orders", rota.Rule("repeat(n=3)"))
//	err = rota.Timed(ctx, client, pick, func() error { return callOrders(pick.Instance.Addr()) })
//
// Errors of rota calls are *Error values carrying the gRPC status code.
//
// Dial(ctx, "") talks to $ROTA_SERVER, else DefaultServer (127.0.0.1:50051). Client.Watch
// streams one service's instance list: a snapshot, then every change, until its context ends.
//
// # Versions
//
// A request may ask for a version of the services it goes through ("zlt" below): rota then
// picks instances of that version, or instances with no version when there are none. The
// version travels in the request's context.Context: Middleware and the server interceptors
// read it from incoming requests (the X-Rota-Version header, the x-rota-version metadata),
// Pick uses it when no Version option is given, and VersionTransport and the client
// interceptors forward it to the next service.
//
// # Fallback
//
// A consumer must not go down with rota. Services followed with WithFallback or
// Client.Follow are mirrored locally through Watch; when rota cannot be reached, Pick
// answers round robin from that copy, sets Pick.LocalFallback and logs a warning.
package rota
