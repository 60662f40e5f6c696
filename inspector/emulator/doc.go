// Package emulator is calltap's emulation of the voice service
// (calltap mock-service): its API under /api/v1/ext/ and its webhook
// deliveries, behaving as the service documentation says, so that
// developers, their CI and calltap's own tests can run whole calls offline.
package emulator
