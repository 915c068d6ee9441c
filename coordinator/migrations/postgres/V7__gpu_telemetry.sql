-- GPU telemetry series: one row per GPU per sample, as agents ship them with heartbeats
-- (default once a second). Integer units: power in mW, energy in mJ (the GPU's total-energy
-- counter), temperature in milli-degrees Celsius. NULL: the GPU could not give that reading.
-- Pruned by age and by count per GPU, in bounded batches. (V6 is another change's.)
CREATE TABLE gpu_telemetry (
    id BIGSERIAL PRIMARY KEY,
    node             TEXT NOT NULL,
    gpu              BIGINT NOT NULL,
    at               BIGINT NOT NULL,
    used_mib         BIGINT,
    free_mib         BIGINT,
    total_mib        BIGINT,
    utilization_pct  BIGINT,
    power_mw         BIGINT,
    energy_mj        BIGINT,
    temperature_mdeg BIGINT,
    sm_clock_mhz     BIGINT,
    throttle         JSONB,
    error            TEXT
);
-- One sample per GPU and instant: a batch sent again (its answer was lost) is stored once.
CREATE UNIQUE INDEX gpu_telemetry_series ON gpu_telemetry (node, gpu, at);
CREATE INDEX gpu_telemetry_age ON gpu_telemetry (at);
