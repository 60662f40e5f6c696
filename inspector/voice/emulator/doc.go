// Package emulator is calltap's emulation of the voice service
// (calltap mock-service): its API under /api/v1/ext/ and its webhook
// deliveries, behaving as the service documentation says, so that
// developers, their CI and calltap's own tests can run whole calls offline.
//
// A Server is built with New, serves its API from Handler, and delivers
// webhooks while Run runs. Its state (contacts, calls, deliveries and every
// attempt) is in SQLite through package storage, so a restart resumes the
// deliveries that were due.
//
// # Documented behaviour and the emulator's own choices
//
// Where the documentation is explicit the emulator follows it; where it
// says "not shown" the emulator had to choose, and says so here.
//
//	Behaviour                          Source        What the emulator does
//	---------------------------------  ------------  -------------------------------------------------------------
//	Envelope {status,message,data,     documented    every response, errors too (package api)
//	error}, page object
//	Error object and codes             own choice    {"code","message"}: unauthorized 401, forbidden 403,
//	                                                 invalid_request 400, not_found 404, method_not_allowed 405,
//	                                                 payload_too_large 413, internal 500
//	Authorization: Bearer <key>        documented    no or unknown key → 401 (keys compared in constant time)
//	Scopes webhooks:read/write         documented    GET /webhooks/{id}/ needs webhooks:read, replay webhooks:write;
//	                                                 a missing scope → 403
//	Scope of GET /webhooks/            own choice    webhooks:read
//	Scope of dispatch, contacts,       own choice    any valid key (the documentation names no other scope)
//	media
//	Dispatch path and request          own choice    POST /calls/dispatch/ with the documented parameters (to_number,
//	                                                 event_webhook_url, event_webhook_headers, event_webhook_events)
//	                                                 plus variables, contact, from_number, campaign_id, agent, and
//	                                                 the emulator's scenario (completed | failed:busy |
//	                                                 failed:no_answer | failed:dispatch_error) and timings
//	                                                 {ring_seconds, talk_seconds, recording_after_seconds,
//	                                                 analysis_after_seconds}; 201 with {call_id, status:"queued",
//	                                                 scenario, contact_id, events}
//	to_number format                   documented    + and country code (E.164: ^\+[1-9][0-9]{6,14}$), else 400
//	http or non-HTTP webhook URL       documented    400 at dispatch; --allow-http-webhooks admits http to a
//	                                                 loopback host only (own choice)
//	No event_webhook_url               own choice    the call runs, nothing is delivered
//	event_webhook_events omitted       documented    all events; an unknown kind → 400; [] → none (own reading)
//	event_webhook_headers              documented    sent with every delivery; Host, Content-Length, Connection and
//	                                                 other framing headers, repeated names and line breaks → 400
//	Event order, exactly one of        documented    completed: started, connected, ended, recording_available,
//	ended/failed                                     analysis_completed (payloads from package callevent);
//	                                                 failed: started, failed with outcome_code busy | no_answer |
//	                                                 dispatch_error
//	Event timing                       own choice    each event is sent at its occurred_at offset × --time-scale;
//	                                                 payloads keep real lengths (duration_seconds 94) and a
//	                                                 call under a scale below 1 is back-dated so no occurred_at
//	                                                 lies after its sending
//	Other headers of a delivery        own choice    Content-Type: application/json, User-Agent:
//	                                                 calltap-mock-service/1; no signature (not shown)
//	Payload id                         documented    unique per delivery, the same across retries and replays;
//	                                                 it is the delivery's id in the log
//	Retry rules and schedule           documented    network error, time-out, 408, 429, 5xx retried at 0, 30 s,
//	                                                 2 min, 8 min, 32 min (× --time-scale, after the previous
//	                                                 attempt ended); other 4xx not retried; 5 attempts at most
//	Attempt time-out                   own choice    --delivery-timeout, default 10 s
//	3xx answers                        own choice    not followed, not retried: the delivery fails
//	Order of a call's deliveries       own choice    one attempt at a time per call, in the order they are due,
//	                                                 so first attempts arrive in event order; retries of one
//	                                                 event do not hold back the others
//	Delivery status values             own choice    pending (an attempt due or under way) → delivered (2xx) or
//	                                                 failed (not retried, or 5 attempts spent); replay → pending
//	Delivery record (2.3)              documented    id, event, url, status, attempts, max_attempts,
//	                                                 response_status, error, call_id, created_at, delivered_at,
//	                                                 payload (the exact bytes sent, as a JSON object),
//	                                                 response_body (first 64 KiB)
//	Nulls and extras of the record     own choice    response_status null before any answer, delivered_at null
//	                                                 until delivered, error "" when none; created_at is when the
//	                                                 event was due; extra next_attempt_at (null unless pending)
//	Attempts listing                   own choice    attempt_log [{n, replay, attempt, at, response_status, error,
//	                                                 duration_ms, response_body}]; attempts counts the current
//	                                                 budget, the log keeps every attempt ever
//	Items of GET /webhooks/            own choice    the record without payload, response_body and attempt_log;
//	                                                 newest first; filters call_id (UUID, else 400) and the
//	                                                 emulator's own event and status
//	Replay                             documented    same payload, fresh budget of 5; {id, status:"pending",
//	                                                 queued:true}; allowed in any state
//	Unknown delivery id (4.2, 4.3)     own choice    404 not_found; a delivery not yet due does not exist yet
//	Paging                             documented    limit default 50, above 200 served as 200 without error,
//	                                                 count ignores limit and offset; limit or offset negative or
//	                                                 not a number → 400 (own choice)
//	Contact record                     own choice    {id, name, phone, email, custom_fields, created_at}, newest
//	                                                 first
//	Contact search                     documented    parameters other than limit and offset filter: contact fields
//	                                                 (id, name, phone, email) first, then custom fields in use;
//	                                                 matching is whole-value and case-insensitive, a repeated
//	                                                 parameter matches any of its values, several parameters all
//	                                                 (own choices); a name that is neither → 400 (own choice)
//	Dispatch and contacts              own choice    a dispatch's contact is saved by id (fields given replace
//	                                                 stored ones); without one, the first contact with to_number
//	                                                 is used or a new one made
//	GET /call_logs/{id}/media/         own choice    {call_id, recording_url, transcript_url, expires_in,
//	shape                                            expires_at}; 404 before call.recording_available is due and
//	                                                 for calls that never connected
//	Signed media links                 documented    short-lived: HMAC-signed, refused (403) from expires_in on;
//	                                                 expires_in is --media-expires-in (default 3600 s, not scaled);
//	                                                 the files are a 1.5 s WAV tone and a plain-text transcript
//	--seed N                           own choice    on an empty database: N contacts (custom fields city, plan,
//	                                                 lead_source) and N past calls, one per 10 minutes, with their
//	                                                 deliveries to https://hooks.example.invalid/voice/events —
//	                                                 most delivered, some after a 503 and a retry, some failed
//	                                                 with a 404
//	Rate limits, payload size limits   not shown     none applied; a dispatch body is limited to 64 KiB
package emulator
