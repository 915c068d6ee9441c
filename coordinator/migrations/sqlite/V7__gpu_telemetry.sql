-- GPU telemetry series: one row per GPU per sample, as agents ship them with heartbeats
-- (default once a second). Integer units: power in mW, energy in mJ (the GPU's total-energy
-- counter), temperature in milli-degrees Celsius. NULL: the GPU could not give that reading.
-- Pruned by age and by count per GPU, in bounded batches. (V6 is another change's.)
CREATE TABLE gpu_telemetry (
    id INTEGER PRIMARY KEY,
    node             TEXT NOT NULL,
    gpu              INTEGER NOT NULL,
    at               INTEGER NOT NULL,
    used_mib         INTEGER,
    free_mib         INTEGER,
    total_mib        INTEGER,
    utilization_pct  INTEGER,
    power_mw         INTEGER,
    energy_mj        INTEGER,
    temperature_mdeg INTEGER,
    sm_clock_mhz     INTEGER,
    throttle         TEXT,
    error            TEXT
);
-- One sample per GPU and instant: a batch sent again (its answer was lost) is stored once.
CREATE UNIQUE INDEX gpu_telemetry_series ON gpu_telemetry (node, gpu, at);
CREATE INDEX gpu_telemetry_age ON gpu_telemetry (at);
