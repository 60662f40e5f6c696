-- The route a capture took (inspector/routes): a route file's route name,
-- "default" (--forward-to) or "filtered" (left out by --events); NULL for
-- captures saved before routes, and for those no route file decided
-- (an agent without one, replays of their captures; an import keeps the
-- route its export had). Not indexed: a listing by route reads the
-- newest rows first and stops at its page, and an insert stays as cheap.
ALTER TABLE captures ADD COLUMN route TEXT;
