-- How an attempt's peak memory was measured (as migrations/sqlite/V5__peak_source.sql).
ALTER TABLE attempts ADD COLUMN peak_source TEXT;
