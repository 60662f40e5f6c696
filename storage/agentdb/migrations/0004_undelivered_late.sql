-- Queued requests saved but not yet sent to the handler: few rows, looked up
-- at every agent start.
CREATE INDEX captures_undelivered_late ON captures (seq) WHERE late = 1 AND attempts = 0;
