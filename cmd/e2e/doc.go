// Package e2e holds the end-to-end tests of the inspector: each starts a
// whole stack (cmd/stacktest: a relay, an agent connected to it through a
// real websocket, the inspector's HTTP server) and drives it from outside,
// as the service and a browser do. The inspector's own tests need no relay
// and stay beside it; these are here so that nothing under inspector/
// imports the relay server, even to test.
package e2e
