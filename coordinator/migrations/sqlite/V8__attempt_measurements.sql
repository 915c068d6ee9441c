-- What an attempt's supervisor measured on its GPUs over the run, and what contaminated it.
-- Integer milli-units as in gpu_telemetry (V7): energy in mJ, power in mW, temperature in
-- milli-degrees Celsius, utilization in thousandths of a percent. NULL: not measured (a
-- reading failed or is not supported, the attempt never started, or it ended before V8).
ALTER TABLE attempts ADD COLUMN energy_mj INTEGER;
-- 'counter' (the GPU's total-energy counter) or 'integrated' (power over the samples).
ALTER TABLE attempts ADD COLUMN energy_source TEXT;
ALTER TABLE attempts ADD COLUMN mean_power_mw INTEGER;
ALTER TABLE attempts ADD COLUMN max_power_mw INTEGER;
ALTER TABLE attempts ADD COLUMN max_temp_mdeg INTEGER;
ALTER TABLE attempts ADD COLUMN start_temp_mdeg INTEGER;
ALTER TABLE attempts ADD COLUMN mean_util_mpct INTEGER;
ALTER TABLE attempts ADD COLUMN throttled_thermal INTEGER;
ALTER TABLE attempts ADD COLUMN throttled_power INTEGER;
-- JSON list of the clock event reasons seen.
ALTER TABLE attempts ADD COLUMN throttle_reasons TEXT;
ALTER TABLE attempts ADD COLUMN contamination_reason TEXT;
ALTER TABLE attempts ADD COLUMN contamination_pid INTEGER;
ALTER TABLE attempts ADD COLUMN contamination_command TEXT;
