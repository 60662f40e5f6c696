package emulator

// Unexported names the external tests need.

// MaxDispatchBody is maxDispatchBody, for the test that sends one byte more.
const MaxDispatchBody = maxDispatchBody

// DispatchResult is the data of a dispatch response, for tests that read it.
type DispatchResult = dispatchResult
