//! Agent settings: what people set for a node's agent, the same for `headroom-agent` and
//! `headroom up` (flags, `HEADROOM_*` variables or the config file), and how they become the
//! GPU backend choice and the `AgentConfig` the agent runs with.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ValueEnum;
use std::str::FromStr;

use headroom_shared::MemSize;
use headroom_shared::api::Headroom;
use headroom_shared::secret::{self, SecretError, SecretSource};
use headroom_shared::settings::duration;

use crate::agent::client::BearerToken;
use crate::agent::{AgentConfig, OnExit};
use crate::gpu::{BackendChoice, FakeGpuSpec};
use crate::supervisor::attempt::SupervisorConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GpuBackendKind {
    /// NVML when an NVIDIA driver is found, fake GPUs otherwise.
    Auto,
    Nvml,
    Fake,
}

/// The agent's settings, as flags (config-file keys are the same names).
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Agent")]
pub struct AgentSettings {
    /// This node's name (default: the host name).
    #[arg(long, env = "HEADROOM_NODE")]
    pub node: Option<String>,
    /// Slots per GPU, e.g. "2,2,2,2,1,1,1" (default: the coordinator's plan for this node,
    /// else one per GPU).
    #[arg(long, env = "HEADROOM_PLAN")]
    pub plan: Option<String>,
    /// A TOML file of plans by node name, for agents that share one configuration (a
    /// Kubernetes DaemonSet): `default = "1,1"` and a `[nodes]` table of `"NAME" = "PLAN"`.
    /// This node's entry is used, else `default`; `--plan` wins over it.
    #[arg(long, env = "HEADROOM_PLANS_FILE")]
    pub plans_file: Option<PathBuf>,
    /// GPU memory kept free: a share (`10%`) or a size (`2GiB`).
    #[arg(long, env = "HEADROOM_HEADROOM", default_value = "10%")]
    pub headroom: Headroom,
    /// The node's host memory, e.g. `64GiB` (default: the kernel's `MemTotal`). Jobs are
    /// admitted against it less `--host-headroom`, by their `resources.host_memory` or what
    /// their runs' peaks taught.
    #[arg(long, env = "HEADROOM_HOST_MEMORY")]
    pub host_memory: Option<MemSize>,
    /// Host memory kept free for the system and the agent: a share (`10%`) or a size.
    #[arg(long, env = "HEADROOM_HOST_HEADROOM", default_value = "10%")]
    pub host_headroom: Headroom,
    /// Where each job's own directory (`HEADROOM_JOB_DIR`, the same for every attempt of
    /// the job on this node: its checkpoints) is made, private to its user. On a cluster,
    /// a filesystem every node mounts lets a requeued job resume on any node.
    #[arg(long, env = "HEADROOM_JOB_DIRS", default_value = "/var/tmp")]
    pub job_dirs: PathBuf,
    #[arg(long, value_enum, env = "HEADROOM_GPU_BACKEND", default_value = "auto")]
    pub gpu_backend: GpuBackendKind,
    /// Fake GPUs, e.g. `4x24GiB` (with `--gpu-backend fake`, or when no driver is found).
    #[arg(long, env = "HEADROOM_FAKE_GPUS", default_value = "4x24GiB")]
    pub fake_gpus: FakeGpuSpec,
    /// Time a job gets between SIGTERM and SIGKILL.
    #[arg(long, env = "HEADROOM_KILL_GRACE", default_value = "10s", value_parser = duration)]
    pub kill_grace: Duration,
    /// How long cleanup may take to verify that an attempt left nothing on its GPUs before
    /// the GPUs are quarantined.
    #[arg(long, env = "HEADROOM_VERIFY_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub verify_timeout: Duration,
    /// Longest wait, before a job's exec, for its start reading of the GPUs (a supervisor
    /// opens NVML while it waits for a lease; one started for the lease opens it then, which
    /// takes seconds without persistence mode). Past it the job starts and its figures say
    /// how late they begin (`covers_run: false`).
    #[arg(long, env = "HEADROOM_START_READING_WAIT", default_value = "20s", value_parser = duration)]
    pub start_reading_wait: Duration,
    /// Before taking work, run `headroom doctor`'s checks of the GPUs (without its
    /// allocation) and refuse to start, naming what failed, when their memory or process
    /// list cannot be read or their processes' pids cannot be mapped: such a node could
    /// never verify a cleanup. Other failed checks are warned about.
    #[arg(long, env = "HEADROOM_REQUIRE_DOCTOR")]
    pub require_doctor: bool,
    /// Kill processes that belong to no job and hold GPU memory (default: report, never kill).
    #[arg(long, env = "HEADROOM_KILL_FOREIGN")]
    pub kill_foreign: bool,
    /// Track attempts by their environment marker and process tree instead of a cgroup of
    /// their own, even where the agent could create cgroups (it says at start which it uses).
    #[arg(long, env = "HEADROOM_NO_CGROUPS")]
    pub no_cgroups: bool,
    /// How often each GPU's telemetry (memory, utilization, power, energy, temperature, SM
    /// clock, throttle reasons) is sampled and shipped with heartbeats; `0s`: never.
    #[arg(long, env = "HEADROOM_TELEMETRY_INTERVAL", default_value = "1s", value_parser = duration)]
    pub telemetry_interval: Duration,
    /// How often an attempt's supervisor looks at its GPUs: its processes' memory (their
    /// peak, and the shape of their run that placement learns), intruders, and its readings.
    #[arg(long, env = "HEADROOM_SAMPLE_EVERY", default_value = "1s", value_parser = duration)]
    pub sample_every: Duration,
    /// Most telemetry samples kept while the coordinator cannot be reached (the oldest go
    /// first, and are counted).
    #[arg(long, env = "HEADROOM_TELEMETRY_BUFFER", default_value_t = 20_000)]
    pub telemetry_buffer: usize,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. `0.0.0.0:9421` for the lab's
    /// Prometheus (default: not served).
    #[arg(long, env = "HEADROOM_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Token of role `agent` (`headroom token create --role agent --name NODE`), for a
    /// coordinator that requires tokens.
    #[arg(long, env = "HEADROOM_AGENT_TOKEN", hide_env_values = true)]
    pub agent_token: Option<BearerToken>,
    /// A file holding the agent's token (one line, mode 0600), kept out of `ps` and of the
    /// environment; systemd's `LoadCredential=agent-token` is read when neither is given.
    #[arg(long, env = "HEADROOM_AGENT_TOKEN_FILE")]
    pub agent_token_file: Option<PathBuf>,
    /// A file holding a join token (`headroom token create --role join`), shared by the
    /// agents of many nodes: with no agent token, an agent exchanges it once for its node's
    /// own credential, which it keeps in its data directory (`node-token`, 0600) and uses
    /// from then on. The join token itself can do nothing else.
    #[arg(long, env = "HEADROOM_JOIN_TOKEN_FILE")]
    pub join_token_file: Option<PathBuf>,
    /// A PEM file of certificates to trust for an `https://` coordinator, beside the
    /// system's (a lab's own CA); the agent's supervisors use it too.
    #[arg(long, env = "HEADROOM_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Variables of the agent's environment that jobs get too, besides PATH, HOME, USER,
    /// LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ, TERM, TMPDIR, LD_LIBRARY_PATH, CUDA_HOME and
    /// CUDA_PATH (comma-separated or repeated). Nothing else of the agent's environment
    /// reaches a job, and never a HEADROOM_* variable.
    #[arg(long, env = "HEADROOM_PASS_ENV", value_delimiter = ',')]
    pub pass_env: Vec<String>,
    /// The Unix user jobs run as when their submitter maps to none (`headroom user create
    /// NAME --unix-user U`), for an agent running as root; never root. An agent not
    /// running as root runs every job as its own user.
    #[arg(long, env = "HEADROOM_RUN_AS_DEFAULT", default_value = "nobody")]
    pub run_as_default: String,
    /// What stopping the agent does to running jobs: `detach` leaves them running under their
    /// supervisors for the next agent on this data directory to re-attach (upgrades,
    /// restarts; they stop themselves if none does within the lease TTL), `stop` stops and
    /// reports them. `headroom up` always stops them.
    #[arg(long, value_enum, env = "HEADROOM_ON_EXIT", default_value = "detach")]
    pub on_exit: OnExit,
}

impl AgentSettings {
    /// The GPU backend to open; fake GPU files live under `data_dir`.
    pub fn backend_choice(&self, data_dir: &Path) -> BackendChoice {
        let dir = data_dir.join("fake-gpus");
        match self.gpu_backend {
            GpuBackendKind::Nvml => BackendChoice::Nvml,
            GpuBackendKind::Fake => BackendChoice::Fake {
                spec: self.fake_gpus.clone(),
                dir,
            },
            GpuBackendKind::Auto => BackendChoice::Auto {
                fake_fallback: self.fake_gpus.clone(),
                dir,
            },
        }
    }

    /// The node's name: the setting, else the host name.
    pub fn node_name(&self) -> String {
        self.node.clone().unwrap_or_else(host_name)
    }

    /// The agent's token: from its file, its value or systemd's credential.
    pub fn token(&self) -> Result<Option<BearerToken>, SecretError> {
        let src = SecretSource {
            flag: "--agent-token",
            file_flag: "--agent-token-file",
            credential: "agent-token",
        };
        let value = self.agent_token.as_ref().map(BearerToken::expose);
        Ok(
            secret::resolve(src, value, self.agent_token_file.as_deref())?
                .map(|t| BearerToken::from_str(&t).unwrap_or_else(|e| match e {})),
        )
    }

    /// The plan this node starts with: `--plan`, else its entry in the plans file, else the
    /// file's default; `None`: the coordinator's.
    pub fn start_plan(&self) -> Result<Option<String>, SettingsError> {
        if self.plan.is_some() {
            return Ok(self.plan.clone());
        }
        let Some(path) = &self.plans_file else {
            return Ok(None);
        };
        let invalid = |message: String| SettingsError::PlansFile {
            path: path.clone(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
        let file: PlansFile = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        Ok(plan_for(&file, &self.node_name()))
    }

    /// The agent's configuration, talking to `coordinator`, keeping logs in `data_dir`.
    pub fn agent_config(
        &self,
        coordinator: String,
        data_dir: PathBuf,
    ) -> Result<AgentConfig, SettingsError> {
        Ok(AgentConfig {
            gpu: self.backend_choice(&data_dir),
            on_exit: self.on_exit,
            supervisor_exe: crate::supervisor::SELF_EXE.into(),
            coordinator,
            node: self.node_name(),
            plan: self.start_plan()?,
            headroom: self.headroom,
            host_memory_mib: self
                .host_memory
                .map(|m| m.mib)
                .or_else(mem_total_mib)
                .map(|total| total.saturating_sub(self.host_headroom.mib_of(total))),
            data_dir,
            supervisor: SupervisorConfig {
                kill_grace: self.kill_grace,
                verify_timeout: self.verify_timeout,
                start_reading_wait: self.start_reading_wait,
                sample_every: self.sample_every,
                ..SupervisorConfig::default()
            },
            claim_wait: Duration::from_secs(20),
            kill_foreign: self.kill_foreign,
            cgroups: !self.no_cgroups,
            telemetry_interval: self.telemetry_interval,
            telemetry_buffer: self.telemetry_buffer,
            metrics_addr: self.metrics_addr,
            token: self.token()?,
            ca_file: self.ca_file.clone(),
            pass_env: self.pass_env.clone(),
            job_dirs: self.job_dirs.clone(),
            run_as_default: self.run_as_default.clone(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("--plans-file {}: {message}", path.display())]
    PlansFile { path: PathBuf, message: String },
}

/// `--plans-file`: plans by node name. The plans themselves are checked where every plan is,
/// by the coordinator at registration, naming the plan.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PlansFile {
    default: Option<String>,
    #[serde(default)]
    nodes: std::collections::BTreeMap<String, String>,
}

fn plan_for(file: &PlansFile, node: &str) -> Option<String> {
    file.nodes.get(node).or(file.default.as_ref()).cloned()
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The kernel's `MemTotal`, in MiB.
fn mem_total_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Args {
        #[command(flatten)]
        settings: AgentSettings,
    }

    fn settings(args: &[&str]) -> AgentSettings {
        Args::try_parse_from(std::iter::once("agent").chain(args.iter().copied()))
            .expect("flags")
            .settings
    }

    fn plans(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(f.path(), text).expect("write");
        f
    }

    const PLANS: &str = "default = \"1,1\"\n[nodes]\n\"gpu-07\" = \"2,2,1,1\"\n";

    #[test]
    fn a_node_gets_its_entry_of_the_plans_file_else_its_default() {
        let f = plans(PLANS);
        let path = f.path().to_str().expect("utf-8");
        let own = settings(&["--node", "gpu-07", "--plans-file", path]);
        assert_eq!(own.start_plan().expect("plan").as_deref(), Some("2,2,1,1"));
        let other = settings(&["--node", "gpu-08", "--plans-file", path]);
        assert_eq!(other.start_plan().expect("plan").as_deref(), Some("1,1"));
        let flag = settings(&["--node", "gpu-07", "--plans-file", path, "--plan", "3"]);
        assert_eq!(flag.start_plan().expect("plan").as_deref(), Some("3"));
    }

    #[test]
    fn without_a_default_an_unlisted_node_takes_the_coordinators_plan() {
        let f = plans("[nodes]\na = \"2\"\n");
        let s = settings(&[
            "--node",
            "b",
            "--plans-file",
            f.path().to_str().expect("utf-8"),
        ]);
        assert_eq!(s.start_plan().expect("plan"), None);
    }

    #[test]
    fn a_bad_plans_file_is_refused_naming_the_file_and_the_key() {
        let f = plans("default = \"1\"\nnode = { a = \"2\" }\n");
        let path = f.path().to_str().expect("utf-8");
        let err = settings(&["--plans-file", path])
            .start_plan()
            .expect_err("refused");
        let msg = err.to_string();
        assert!(msg.contains("--plans-file") && msg.contains(path), "{msg}");
        assert!(msg.contains("unknown field `node`"), "{msg}");
        let missing = settings(&["--plans-file", "/nonexistent/plans.toml"]);
        assert!(missing.start_plan().is_err());
    }
}
