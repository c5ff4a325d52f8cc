//! A real Kubernetes control plane for the end-to-end tests: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler as built by `scripts/control-plane.sh build`,
//! started per test on 127.0.0.1 and stopped when [`RealControlPlane`] is dropped.
//!
//! The test kit starts the processes itself (rather than the script) because it must serve the
//! TokenReview webhook ([`webhook`]) before kube-apiserver starts and hand it the plane's ports,
//! CA and admin token; it then owns every process and kills them on drop (and a watchdog kills
//! them if the test process dies first).
//!
//! Authentication is EKS's: EKS tokens go through the webhook (fake STS, access entries,
//! `aws-auth`); the test kit's own identities (admin, controller-manager, scheduler, kwok as the
//! kubelets, the kit's node agent) use `--token-auth-file`. Authorization is `Node,RBAC`. An audit log at level
//! `Request` records what the code under test did ([`RealControlPlane::audit`]).

pub mod attacher;
pub mod certs;
pub mod kubelet;
pub mod kwok;
pub mod scenarios;
pub mod webhook;
pub mod workload;
pub mod world;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use rand::Rng as _;
use sha2::Digest as _;

use self::certs::PlaneCertificates;
use self::webhook::{TokenWebhook, WebhookSettings};
use crate::kube::AuditEvent;

/// The Kubernetes release `scripts/control-plane.sh` builds (checked against the script).
pub const KUBERNETES_VERSION: &str = "v1.36.3";
/// A folder holding the built binaries, in place of the cache.
pub const BIN_VARIABLE: &str = "ONM_CONTROL_PLANE_BIN";
/// The cache the script builds into (default `~/.cache/open-node-manager/control-plane`).
pub const CACHE_VARIABLE: &str = "ONM_CONTROL_PLANE_CACHE";
/// Set to `1` to skip (with a printed line) the tests that need the plane when it is not built.
pub const SKIP_VARIABLE: &str = "SKIP_REAL_CONTROL_PLANE_TESTS";
/// The binaries the plane runs.
pub const BINARIES: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];
/// Every binary the build script builds: the plane's, kubectl from the same module (for
/// the comparisons with `kubectl drain`, within the supported version skew) and kwok (the
/// kubelets, [`kwok`]).
pub const BUILT: [&str; 6] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
];
/// How long the whole plane may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(45);

/// Why the plane could not be found or started.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error(
        "the real Kubernetes control plane is not built ({0} is missing): run `scripts/control-plane.sh build` (about 10 minutes, once; needs Go 1.26), or set SKIP_REAL_CONTROL_PLANE_TESTS=1 to skip the tests that need it"
    )]
    NotBuilt(PathBuf),
    #[error("{what} failed: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {detail}")]
    Setup { what: String, detail: String },
    #[error("generating the control plane's certificates failed: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("{process} exited before the plane was ready ({status}); its log ends:\n{log}")]
    Exited {
        process: String,
        status: String,
        log: String,
    },
    #[error("the control plane was not ready after {0:?}: {1}")]
    NotReady(Duration, String),
}

impl ControlPlaneError {
    /// A step around the plane that failed: `what`, and why.
    pub fn setup(what: impl Into<String>, error: impl std::fmt::Display) -> Self {
        Self::Setup {
            what: what.into(),
            detail: error.to_string(),
        }
    }
}

/// The folder the binaries are read from: [`BIN_VARIABLE`], else the one the build script
/// names (`scripts/control-plane.sh bin-dir`: its cache key covers the version, the build
/// module, the Go toolchain and the flags, and has its home there). Asked once per process;
/// a script that cannot answer (no Go on PATH) leaves a folder that holds nothing.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(BIN_VARIABLE) {
        return PathBuf::from(dir);
    }
    static FROM_SCRIPT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FROM_SCRIPT
        .get_or_init(|| {
            let script = crate::soak::corpus::repository_root().join("scripts/control-plane.sh");
            Command::new("bash")
                .arg(&script)
                .arg("bin-dir")
                .output()
                .ok()
                .filter(|out| out.status.success())
                .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
                .unwrap_or_else(|| PathBuf::from("/nonexistent/control-plane-bin-dir-unknown"))
        })
        .clone()
}

/// What the binaries in `dir` are, checked once per process against the pins: each
/// Kubernetes binary reports [`KUBERNETES_VERSION`] (`--version`), etcd the version the build
/// module requires; the SHA-256 of each is printed with the test output. `Err` says which
/// binary is not what the tests were written against.
pub fn check_provenance(dir: &Path) -> Result<(), ControlPlaneError> {
    static CHECKED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    CHECKED
        .get_or_init(|| provenance_of(dir))
        .clone()
        .map_err(|detail| ControlPlaneError::Setup {
            what: format!("checking the binaries in {}", dir.display()),
            detail,
        })
}

/// [`check_provenance`] for `dir`, not remembered: `Err` names the first binary that is not
/// the pinned one.
pub fn provenance_of(dir: &Path) -> Result<(), String> {
    let etcd_pin = etcd_version_required()?;
    for binary in BUILT {
        let path = dir.join(binary);
        let mut args = vec!["--version"];
        if binary == "kubectl" {
            args = vec!["version", "--client"];
        }
        let output = Command::new(&path)
            .args(&args)
            .output()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let reported = String::from_utf8_lossy(&output.stdout);
        let expected = match binary {
            "etcd" => format!("etcd Version: {etcd_pin}"),
            "kubectl" => format!("Client Version: {KUBERNETES_VERSION}"),
            // kwok names its Go toolchain after the version ("kwok version v0.8.0 go1.26.8 ...").
            "kwok" => format!("kwok version {} ", kwok::KWOK_VERSION),
            _ => format!("Kubernetes {KUBERNETES_VERSION}"),
        };
        let reports = |line: &str| line.trim() == expected || line.starts_with(&expected);
        if !reported.lines().any(reports) {
            return Err(format!(
                "{binary} reports {:?}, expected {expected:?}: rebuild with `scripts/control-plane.sh build`",
                reported.trim()
            ));
        }
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        println!(
            "control plane binary {binary} ({}): sha256 {}",
            expected.trim_end(),
            hex::encode(sha2::Sha256::digest(&bytes))
        );
    }
    Ok(())
}

/// The etcd release the build module requires (`go.etcd.io/etcd/server/v3 vX.Y.Z` in its
/// go.mod): the one pin for etcd.
fn etcd_version_required() -> Result<String, String> {
    let go_mod = crate::soak::corpus::repository_root().join("tests/control-plane/go.mod");
    let text =
        std::fs::read_to_string(&go_mod).map_err(|e| format!("{}: {e}", go_mod.display()))?;
    text.lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("go.etcd.io/etcd/server/v3"))
                .then(|| words.next())
                .flatten()
                .and_then(|v| v.strip_prefix('v'))
                .map(str::to_owned)
        })
        .ok_or_else(|| format!("{} requires no go.etcd.io/etcd/server/v3", go_mod.display()))
}

/// The binaries' folder when every binary is there.
pub fn built_binaries() -> Result<PathBuf, ControlPlaneError> {
    let dir = bin_dir();
    match BUILT.iter().map(|b| dir.join(b)).find(|p| !p.is_file()) {
        Some(missing) => Err(ControlPlaneError::NotBuilt(missing)),
        None => Ok(dir),
    }
}

/// For a test that needs the plane: the binaries' folder, or `None` (with a printed line)
/// when they are missing and [`SKIP_VARIABLE`] is `1`. Panics with how to build them otherwise,
/// and always under CI (`CI=true`, which `.ci/run` sets): there a test that cannot run fails
/// rather than pass having checked nothing.
pub fn binaries_or_skip(test: &str) -> Option<PathBuf> {
    let in_ci = std::env::var("CI").as_deref() == Ok("true");
    match built_binaries() {
        Ok(dir) => Some(dir),
        Err(error) if !in_ci && std::env::var(SKIP_VARIABLE).as_deref() == Ok("1") => {
            println!("skipped {test}: {SKIP_VARIABLE}=1 and {error}");
            None
        }
        Err(error) => panic!("{test}: {error}"),
    }
}

/// Identities of the test kit's own clients (`--token-auth-file`).
struct StaticUser {
    token: String,
    name: &'static str,
    groups: &'static str,
}

impl StaticUser {
    fn new(name: &'static str, groups: &'static str) -> Self {
        let token = hex::encode(rand::rng().random::<[u8; 16]>());
        Self {
            token,
            name,
            groups,
        }
    }
}

/// A running plane. Dropping it kills its processes and removes its folder.
pub struct RealControlPlane {
    dir: PathBuf,
    url: String,
    certificates: PlaneCertificates,
    admin: StaticUser,
    kubelet: StaticUser,
    webhook: TokenWebhook,
    /// The folder the binaries were started from.
    bin: PathBuf,
    /// kube-apiserver's flags, for a restart.
    apiserver_args: Vec<String>,
    /// Behind locks only so that a test holding the plane shared can restart kube-apiserver.
    processes: std::sync::Mutex<Vec<(String, Child)>>,
    watchdog: std::sync::Mutex<Option<Child>>,
    ready_after: Duration,
}

/// The ports the plane listens on (127.0.0.1).
struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    apiserver: u16,
}

impl Ports {
    /// Free ports, held together while chosen so they differ, below the kernel's ephemeral
    /// range: a port the kernel picks for `:0` is one it also hands to outgoing connections,
    /// so between choosing it and etcd binding it, any client (another plane's controllers,
    /// a function) could take it ("address already in use").
    fn free() -> Result<Self, ControlPlaneError> {
        let below = ephemeral_range_start().clamp(12_000, 65_535);
        let mut held = Vec::new();
        for _ in 0..200 {
            let port = rand::rng().random_range(10_000..below);
            if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                held.push(listener);
            }
            if held.len() == 3 {
                let port = |i: usize| held[i].local_addr().map(|a| a.port()).unwrap_or_default();
                return Ok(Self {
                    etcd_client: port(0),
                    etcd_peer: port(1),
                    apiserver: port(2),
                });
            }
        }
        Err(ControlPlaneError::Io {
            what: format!("choosing free ports between 10000 and {below}"),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        })
    }
}

/// The first port of the kernel's ephemeral range (Linux's default when it cannot be read).
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

impl RealControlPlane {
    /// Starts etcd, the webhook, kube-apiserver, kube-controller-manager and kube-scheduler,
    /// and waits until the apiserver is ready, both controllers hold their leases and the
    /// `default` service account exists.
    pub async fn start(
        bin: &Path,
        webhook: WebhookSettings,
    ) -> Result<RealControlPlane, ControlPlaneError> {
        Self::start_with(bin, webhook, &[]).await
    }

    /// [`RealControlPlane::start`] with more kube-apiserver flags (e.g. a small
    /// `--max-requests-inflight` for a brownout), after the plane's own.
    pub async fn start_with(
        bin: &Path,
        webhook: WebhookSettings,
        apiserver_flags: &[String],
    ) -> Result<RealControlPlane, ControlPlaneError> {
        check_provenance(bin)?;
        let started = Instant::now();
        let dir = std::env::temp_dir().join(format!(
            "onm-control-plane-{}-{}",
            std::process::id(),
            hex::encode(rand::rng().random::<[u8; 4]>())
        ));
        std::fs::create_dir_all(&dir).map_err(|source| ControlPlaneError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })?;
        let certificates = PlaneCertificates::generate(&dir)?;
        let ports = Ports::free()?;
        let url = format!("https://127.0.0.1:{}", ports.apiserver);
        let admin = StaticUser::new("kubernetes-admin", "system:masters");
        let kubelet = StaticUser::new(kubelet::NODE_AGENT, "");
        let controller_manager = StaticUser::new("system:kube-controller-manager", "");
        let scheduler = StaticUser::new("system:kube-scheduler", "");
        let kubelets = StaticUser::new(kwok::USER, "");
        let admin_config = client_config(&url, &certificates.ca_pem, &admin.token).await?;
        let admin_client = kube::Client::try_from(admin_config).map_err(|e| setup("client", e))?;
        let webhook = TokenWebhook::start(webhook, admin_client.clone()).await?;

        let mut plane = RealControlPlane {
            dir,
            url,
            certificates,
            admin,
            kubelet,
            webhook,
            bin: bin.to_owned(),
            apiserver_args: Vec::new(),
            processes: std::sync::Mutex::default(),
            watchdog: std::sync::Mutex::default(),
            ready_after: Duration::ZERO,
        };
        plane.write_files(&[&controller_manager, &scheduler, &kubelets])?;
        plane.spawn(bin, "etcd", &plane.etcd_args(&ports))?;
        let mut apiserver_args = plane.apiserver_args(&ports);
        apiserver_args.extend_from_slice(apiserver_flags);
        plane.spawn(bin, "kube-apiserver", &apiserver_args)?;
        plane.apiserver_args = apiserver_args;
        plane.wait_ready(&admin_client, started).await?;
        check_served_version(&admin_client).await?;
        kwok::grant(&admin_client).await?;
        kubelet::grant(&admin_client).await?;
        plane.spawn(
            bin,
            "kube-controller-manager",
            &plane.controller_manager_args(),
        )?;
        plane.spawn(bin, "kube-scheduler", &plane.scheduler_args())?;
        let kwok_args = kwok::args(&plane.path("kwok.yaml"), &plane.path("kwok.kubeconfig"));
        plane.spawn(bin, "kwok", &kwok_args)?;
        plane.start_watchdog()?;
        plane.wait_for_controllers(&admin_client, started).await?;
        plane.ready_after = started.elapsed();
        Ok(plane)
    }

    /// The apiserver's URL (`https://127.0.0.1:<port>`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster CA, base64-encoded as EKS's `certificateAuthority.data`.
    pub fn ca_data(&self) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(self.certificates.ca_pem.as_bytes())
    }

    /// The plane's folder (logs, kubeconfigs, audit log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How long the start took until everything was ready.
    pub fn ready_after(&self) -> Duration {
        self.ready_after
    }

    /// The kubeconfig of the admin (`system:masters`), e.g. for kubectl.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// A client as the admin (kube's retries off).
    pub async fn admin_client(&self) -> Result<kube::Client, ControlPlaneError> {
        self.client_with_token(&self.admin.token).await
    }

    /// A client as the kit's node agent (node registration, images, volumes and the CSI
    /// attacher, [`kubelet`]; its requests are left out of the audit log).
    pub async fn kubelet_client(&self) -> Result<kube::Client, ControlPlaneError> {
        self.client_with_token(&self.kubelet.token).await
    }

    /// A client presenting `token` (e.g. an EKS token), kube's retries off.
    pub async fn client_with_token(&self, token: &str) -> Result<kube::Client, ControlPlaneError> {
        let config = client_config(&self.url, &self.certificates.ca_pem, token).await?;
        kube::Client::try_from(config).map_err(|e| setup("client", e))
    }

    /// The token webhook (its reviews).
    pub fn webhook(&self) -> &TokenWebhook {
        &self.webhook
    }

    /// The audit log so far, one event per request as the test kit's API server logs it,
    /// from every client but the plane's own components and the kubelets.
    ///
    /// kube-apiserver logs a request at each stage it reaches: a watch (a long-running
    /// request) at `ResponseStarted` and again at `ResponseComplete` when it ends, anything
    /// else at `ResponseComplete` (`RequestReceived` is omitted by the policy). The first
    /// event of each `auditID` is kept, so a watch counts once, as on the fake.
    pub fn audit(&self) -> Vec<AuditEvent> {
        let mut seen = std::collections::HashSet::new();
        self.audit_stages()
            .into_iter()
            .filter(|event| seen.insert(event.audit_id.clone()))
            .collect()
    }

    /// Every event of the audit log, each stage of a request on its own.
    pub fn audit_stages(&self) -> Vec<AuditEvent> {
        let text = std::fs::read_to_string(self.dir.join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Resident memory of each process now (kB, from /proc), for the report of a run.
    pub fn memory_kib(&self) -> Vec<(String, u64)> {
        self.processes()
            .iter()
            .map(|(name, child)| {
                let rss = crate::lambda_api::status_kib(&child.id().to_string(), "VmRSS");
                (name.clone(), rss.unwrap_or(0))
            })
            .collect()
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn processes(&self) -> std::sync::MutexGuard<'_, Vec<(String, Child)>> {
        self.processes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Freezes the named component with `SIGSTOP` until [`Self::resume`], as a component that
    /// hangs does: it sends nothing, handles nothing and renews no lease. Returns once every
    /// thread of it has stopped (the signal is delivered asynchronously).
    pub fn pause(&self, name: &str) -> Result<(), ControlPlaneError> {
        let pid = self.pid_of(name)?;
        send_signal(pid, "STOP")?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !every_thread_stopped(pid) {
            if Instant::now() > deadline {
                return Err(setup(&format!("pausing {name}"), "still running after 5 s"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Lets a component [`Self::pause`] froze run on (`SIGCONT`).
    pub fn resume(&self, name: &str) -> Result<(), ControlPlaneError> {
        send_signal(self.pid_of(name)?, "CONT")
    }

    fn pid_of(&self, name: &str) -> Result<u32, ControlPlaneError> {
        self.processes()
            .iter()
            .find(|(running, _)| running == name)
            .map(|(_, child)| child.id())
            .ok_or_else(|| setup(&format!("signalling {name}"), "it is not running"))
    }

    /// Restarts kube-apiserver as when a control plane instance is lost and replaced: killed,
    /// started again with the same flags, and ready (about two seconds here; a `SIGTERM`'s
    /// graceful shutdown takes 45). Every watch is cut, and the new watch cache starts from a
    /// list at the current revision: a watch resuming from an earlier one is answered
    /// `410 Expired`. The other processes reconnect by themselves.
    pub async fn restart_apiserver(&self) -> Result<(), ControlPlaneError> {
        let started = Instant::now();
        let old = {
            let mut processes = self.processes();
            let index = processes
                .iter()
                .position(|(name, _)| name == "kube-apiserver");
            index.map(|i| processes.remove(i).1)
        };
        let mut old = old.ok_or_else(|| setup("restarting kube-apiserver", "it is not running"))?;
        let _ = old.kill();
        let _ = old.wait();
        self.spawn(&self.bin, "kube-apiserver", &self.apiserver_args)?;
        self.start_watchdog()?;
        let admin = self.admin_client().await?;
        self.wait_ready(&admin, started).await
    }

    fn write(&self, name: &str, contents: &str) -> Result<(), ControlPlaneError> {
        let path = self.dir.join(name);
        std::fs::write(&path, contents).map_err(|source| ControlPlaneError::Io {
            what: format!("writing {}", path.display()),
            source,
        })
    }

    fn write_files(&self, components: &[&StaticUser]) -> Result<(), ControlPlaneError> {
        let mut tokens = String::new();
        for user in [&self.admin, &self.kubelet]
            .into_iter()
            .chain(components.iter().copied())
        {
            tokens.push_str(&format!(
                "{},{},{},\"{}\"\n",
                user.token, user.name, user.name, user.groups
            ));
        }
        self.write("tokens.csv", &tokens)?;
        self.write("audit-policy.yaml", &audit_policy())?;
        self.write("token-webhook.kubeconfig", &self.webhook.kubeconfig_yaml())?;
        self.write(
            "admin.kubeconfig",
            &kubeconfig_yaml(&self.url, &self.certificates.ca_pem, &self.admin.token),
        )?;
        self.write("kwok.yaml", &kwok::configuration())?;
        for (file, user) in [
            "kube-controller-manager.kubeconfig",
            "kube-scheduler.kubeconfig",
            "kwok.kubeconfig",
        ]
        .into_iter()
        .zip(components)
        {
            self.write(
                file,
                &kubeconfig_yaml(&self.url, &self.certificates.ca_pem, &user.token),
            )?;
        }
        Ok(())
    }

    fn etcd_args(&self, ports: &Ports) -> Vec<String> {
        let client = format!("http://127.0.0.1:{}", ports.etcd_client);
        let peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
        vec![
            "--name=default".into(),
            format!("--data-dir={}", self.path("etcd")),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=default={peer}"),
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ]
    }

    fn apiserver_args(&self, ports: &Ports) -> Vec<String> {
        let c = &self.certificates;
        vec![
            format!("--etcd-servers=http://127.0.0.1:{}", ports.etcd_client),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", ports.apiserver),
            format!("--tls-cert-file={}", c.serving_cert_file.display()),
            format!("--tls-private-key-file={}", c.serving_key_file.display()),
            format!("--client-ca-file={}", c.ca_file.display()),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!(
                "--service-account-signing-key-file={}",
                c.service_account_key_file.display()
            ),
            format!(
                "--service-account-key-file={}",
                c.service_account_public_file.display()
            ),
            "--authorization-mode=Node,RBAC".into(),
            format!("--token-auth-file={}", self.path("tokens.csv")),
            format!(
                "--authentication-token-webhook-config-file={}",
                self.path("token-webhook.kubeconfig")
            ),
            "--authentication-token-webhook-cache-ttl=0s".into(),
            "--endpoint-reconciler-type=none".into(),
            format!("--audit-policy-file={}", self.path("audit-policy.yaml")),
            format!("--audit-log-path={}", self.path("audit.log")),
            "--audit-log-format=json".into(),
            "--profiling=false".into(),
        ]
    }

    fn controller_manager_args(&self) -> Vec<String> {
        let mut args = vec![
            format!(
                "--kubeconfig={}",
                self.path("kube-controller-manager.kubeconfig")
            ),
            "--secure-port=0".into(),
            // Off so that a test decides when a kubelet is seen dead: the controller would
            // mark a node whose Lease kwok stopped renewing `Ready=Unknown` only after its
            // 40 s grace, and evict its pods 300 s later; the kit marks it at once instead.
            // The taint-eviction controller runs: the only `NoExecute` taint here is the
            // out-of-service one, whose pods it must delete (non-graceful node shutdown).
            "--controllers=*,-node-lifecycle-controller".into(),
            "--use-service-account-credentials".into(),
            format!(
                "--service-account-private-key-file={}",
                self.certificates.service_account_key_file.display()
            ),
            format!("--root-ca-file={}", self.certificates.ca_file.display()),
            "--kube-api-qps=200".into(),
            "--kube-api-burst=400".into(),
        ];
        args.extend(long_leader_leases());
        args
    }

    fn scheduler_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--kubeconfig={}", self.path("kube-scheduler.kubeconfig")),
            "--secure-port=0".into(),
        ];
        args.extend(long_leader_leases());
        args
    }

    fn spawn(&self, bin: &Path, name: &str, args: &[String]) -> Result<(), ControlPlaneError> {
        let log =
            std::fs::File::create(self.dir.join(format!("{name}.log"))).map_err(|source| {
                ControlPlaneError::Io {
                    what: format!("creating {name}.log"),
                    source,
                }
            })?;
        let stderr = log.try_clone().map_err(|source| ControlPlaneError::Io {
            what: format!("opening {name}.log"),
            source,
        })?;
        let child = Command::new(bin.join(name))
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(|source| ControlPlaneError::Io {
                what: format!("starting {}", bin.join(name).display()),
                source,
            })?;
        self.processes().push((name.to_owned(), child));
        Ok(())
    }

    /// A shell that kills the plane's processes once this test process is gone (a test killed
    /// by a timeout runs no destructor).
    fn start_watchdog(&self) -> Result<(), ControlPlaneError> {
        let pids: Vec<String> = self
            .processes()
            .iter()
            .map(|(_, c)| c.id().to_string())
            .collect();
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"parent=$1; shift; while kill -0 "$parent" 2>/dev/null; do sleep 1; done; kill -9 "$@" 2>/dev/null"#)
            .arg("watchdog")
            .arg(std::process::id().to_string())
            .args(pids)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| ControlPlaneError::Io {
                what: "starting the control plane's watchdog".into(),
                source,
            })?;
        let previous = self
            .watchdog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(child);
        if let Some(mut previous) = previous {
            let _ = previous.kill();
            let _ = previous.wait();
        }
        Ok(())
    }

    /// An error when a process has exited, with the end of its log.
    fn check_alive(&self) -> Result<(), ControlPlaneError> {
        for (name, child) in self.processes().iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(ControlPlaneError::Exited {
                    process: name.clone(),
                    status: status.to_string(),
                    log: log_tail(&self.dir.join(format!("{name}.log"))),
                });
            }
        }
        Ok(())
    }

    async fn wait_ready(
        &self,
        client: &kube::Client,
        started: Instant,
    ) -> Result<(), ControlPlaneError> {
        loop {
            self.check_alive()?;
            let last = match readyz(client).await {
                Ok(()) => return Ok(()),
                Err(error) => error,
            };
            if started.elapsed() > READY_TIMEOUT {
                return Err(ControlPlaneError::NotReady(READY_TIMEOUT, last));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Both controllers hold their leader leases and the `default` service account exists.
    async fn wait_for_controllers(
        &self,
        client: &kube::Client,
        started: Instant,
    ) -> Result<(), ControlPlaneError> {
        let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), "kube-system");
        let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), "default");
        loop {
            self.check_alive()?;
            let kcm = leases.get_opt("kube-controller-manager").await;
            let scheduler = leases.get_opt("kube-scheduler").await;
            let account = accounts.get_opt("default").await;
            if matches!(
                (&kcm, &scheduler, &account),
                (Ok(Some(_)), Ok(Some(_)), Ok(Some(_)))
            ) {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(ControlPlaneError::NotReady(
                    READY_TIMEOUT,
                    format!(
                        "controller-manager lease {:?}, scheduler lease {:?}, default service account {:?}",
                        kcm.map(|l| l.is_some()),
                        scheduler.map(|l| l.is_some()),
                        account.map(|a| a.is_some())
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for RealControlPlane {
    fn drop(&mut self) {
        for (_, child) in self.processes().iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let watchdog = self
            .watchdog
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut watchdog) = watchdog {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        if std::env::var_os("ONM_KEEP_CONTROL_PLANE_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Leader leases that outlast a restart of kube-apiserver ([`RealControlPlane::restart_apiserver`]):
/// with the default 10 s to renew, a controller that cannot reach the API server for longer
/// gives up its lease and exits, as it should in a cluster where the kubelet restarts it; the
/// plane has one of each and nothing to restart them.
fn long_leader_leases() -> [String; 2] {
    [
        "--leader-elect-lease-duration=90s".into(),
        "--leader-elect-renew-deadline=60s".into(),
    ]
}

/// The test kit's own components and the kubelets (kwok and the kit's) are not audited: the log holds
/// what the code under test and the test set-up did.
fn audit_policy() -> String {
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  users: [system:kube-controller-manager, system:kube-scheduler, system:apiserver, {}, {}]
- level: None
  userGroups: [system:serviceaccounts:kube-system]
- level: Request
",
        kubelet::NODE_AGENT,
        kwok::USER
    )
}

fn setup(what: &str, error: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::Setup {
        what: what.to_owned(),
        detail: error.to_string(),
    }
}

fn kubeconfig_yaml(url: &str, ca_pem: &str, token: &str) -> String {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    user: user\ncurrent-context: real\n"
    )
}

/// A client configuration for `url` trusting `ca_pem`, presenting `token`; kube's retries off.
async fn client_config(
    url: &str,
    ca_pem: &str,
    token: &str,
) -> Result<kube::Config, ControlPlaneError> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&kubeconfig_yaml(url, ca_pem, token))
        .map_err(|e| setup("kubeconfig", e))?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| setup("kubeconfig", e))?;
    config.default_retry = false;
    Ok(config)
}

/// Binds `user` to a ClusterRole of its own name holding `rules` (a JSON array of RBAC rules),
/// applied as `admin` ([`world::apply_manifest`]).
pub async fn grant_cluster_role(
    admin: &kube::Client,
    user: &str,
    rules: &str,
) -> Result<(), ControlPlaneError> {
    let rules: serde_json::Value =
        serde_json::from_str(rules).map_err(|e| setup(&format!("{user}'s role"), e))?;
    let group = "rbac.authorization.k8s.io";
    let role = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": user}, "rules": rules,
    });
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": user},
        "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": user},
        "subjects": [{"apiGroup": group, "kind": "User", "name": user}],
    });
    // JSON documents are YAML documents.
    world::apply_manifest(admin, &format!("{role}\n---\n{binding}")).await?;
    Ok(())
}

/// `GET /version` must report [`KUBERNETES_VERSION`]: the plane under test is the pinned one.
async fn check_served_version(client: &kube::Client) -> Result<(), ControlPlaneError> {
    let info = client
        .apiserver_version()
        .await
        .map_err(|e| setup("GET /version", e))?;
    if info.git_version != KUBERNETES_VERSION {
        return Err(setup(
            "GET /version",
            format!(
                "kube-apiserver serves {}, the pin is {KUBERNETES_VERSION}",
                info.git_version
            ),
        ));
    }
    Ok(())
}

/// `GET /readyz`: `Err` says why it is not ready (yet).
async fn readyz(client: &kube::Client) -> Result<(), String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The last 40 lines of a log file.
fn log_tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        let _ = file.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Sends `SIG<signal>` to `pid` with kill(1).
fn send_signal(pid: u32, signal: &str) -> Result<(), ControlPlaneError> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(|source| ControlPlaneError::Io {
            what: format!("sending SIG{signal} to {pid}"),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(setup(&format!("sending SIG{signal} to {pid}"), status))
    }
}

/// Whether every thread of `pid` is in the stopped state (`T` in `/proc/<pid>/task/*/stat`).
fn every_thread_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name, which is in parentheses and may hold spaces.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state == "T" || state == "t")
        })
    })
}
