-- Once a node's GPUs are all taken, a claim looks further down the queue only for jobs that
-- need no GPU (a CPU slot may be free). Read through `jobs_waiting` that meant every waiting
-- job at each claim; this index holds only the waiting CPU-only ones, in placement order.
CREATE INDEX jobs_waiting_cpu ON jobs (priority DESC, seq) WHERE state IN ('queued', 'retrying') AND gpus = 0;
