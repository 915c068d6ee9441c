-- The nodes a join token may make (a JSON array of names and `*`/`?` patterns, the admin's
-- decision); NULL for other tokens. A join token kept from before names none, and joins none.
ALTER TABLE tokens ADD COLUMN nodes TEXT;
