-- How an attempt's peak memory was measured: 'processes' (per process, as the driver
-- reports it) or 'device_delta' (the GPUs' used-memory growth). NULL: no peak, or recorded
-- before the source was kept.
ALTER TABLE attempts ADD COLUMN peak_source TEXT;
