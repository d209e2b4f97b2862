//! One deployment of stocksvr on the secure stack, set up as an operator would: its own
//! topic namespace and group prefix, the ACLs `stocksvr acls print` prints for them applied
//! with `scripts/stack acls apply`, its topics created by the admin principal, its schemas
//! registered, its database made by the stack's admin user. Every command and server it
//! runs keeps its output, for the check that no secret reached any of it.

use serde_json::Value;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use stocksvr_test_support::{repo_root, secure_stack, unique, ChildGuard, PrivateStack, SecureDb};

pub struct Deployment {
    pub stack: &'static PrivateStack,
    /// Topic namespace and group prefix.
    pub ns: String,
    pub db: SecureDb,
    /// The service's variables: the stack's, in this namespace and database.
    env: Vec<(String, String)>,
    /// Every output kept: command outputs, and the log files of servers.
    outputs: Mutex<Vec<String>>,
    logs: Mutex<Vec<PathBuf>>,
}

/// The binary, with none of the caller's `STOCKSVR__` variables (a shell that exported the
/// dev stack's would otherwise mix them in).
fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stocksvr"));
    for (key, _) in std::env::vars() {
        if key.starts_with("STOCKSVR__") || key == "STOCKSVR_CONFIG" {
            cmd.env_remove(key);
        }
    }
    cmd.current_dir(repo_root());
    cmd
}

impl Deployment {
    /// Set up with every printed ACL but the lines containing `withhold` (none when empty).
    pub async fn new(withhold: &str) -> Self {
        let deployment = Self::without_kafka().await;
        let printed = deployment.run(&["acls", "print", "--role", "all"], &[]);
        let granted: String = printed
            .lines()
            .filter(|l| withhold.is_empty() || !l.contains(withhold))
            .map(|l| format!("{l}\n"))
            .collect();
        deployment.apply_acls(&granted);
        let admin = deployment.stack.kafka_principal_env("TOPICS_ADMIN");
        deployment.run(&["topics", "apply"], &admin);
        deployment.run(&["schemas", "register"], &[]);
        deployment
    }

    /// Its namespace and database only: no ACLs, topics or schemas, for a test of the
    /// operator commands that reach MySQL and Redis alone.
    pub async fn without_kafka() -> Self {
        stocksvr_pipeline::tls::install_crypto_provider();
        let stack = secure_stack();
        let ns = unique("t");
        let db = stack.database().await;
        let mut env = stack.service_env();
        env.retain(|(k, _)| k != "STOCKSVR__MYSQL__URL" && k != "STOCKSVR__HTTP__LISTEN");
        env.extend([
            ("STOCKSVR__KAFKA__TOPIC_NAMESPACE".into(), ns.clone()),
            ("STOCKSVR__KAFKA__GROUP_PREFIX".into(), ns.clone()),
            (
                "STOCKSVR__KAFKA__TOPICS_FILE".into(),
                repo_root().join("topics.yaml").display().to_string(),
            ),
            ("STOCKSVR__MYSQL__URL".into(), db.url.clone()),
        ]);
        Self {
            stack,
            ns,
            db,
            env,
            outputs: Mutex::default(),
            logs: Mutex::default(),
        }
    }

    /// `scripts/stack acls apply` of `lines`; what it said is kept with the outputs.
    pub fn apply_acls(&self, lines: &str) {
        let said = self.stack.apply_acls(lines);
        self.keep(said);
    }

    /// This deployment's name of a declared topic.
    pub fn topic(&self, logical: &str) -> String {
        format!("{}.{logical}", self.ns)
    }

    fn keep(&self, text: String) {
        self.outputs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(text);
    }

    fn command(&self, extra: &[(String, String)]) -> Command {
        let mut cmd = bin();
        cmd.envs(self.env.iter().cloned())
            .envs(extra.iter().cloned());
        cmd
    }

    /// The variables that make the registry client use the stack's bearer token for the
    /// service instead of basic auth (`None` values unset a variable).
    pub fn registry_token_env(&self) -> Vec<(String, Option<String>)> {
        vec![
            (
                "STOCKSVR__REGISTRY__TOKEN_FILE".into(),
                Some(self.stack.export("STACK_REGISTRY_TOKEN_FILE")),
            ),
            ("STOCKSVR__REGISTRY__USERNAME".into(), None),
            ("STOCKSVR__REGISTRY__PASSWORD_FILE".into(), None),
        ]
    }

    /// Runs `stocksvr <args>` to success and returns its standard output.
    pub fn run(&self, args: &[&str], extra: &[(String, String)]) -> String {
        let (ok, stdout, stderr) = self.try_run(args, extra);
        assert!(ok, "stocksvr {args:?} failed: {stdout}{stderr}");
        stdout
    }

    /// Runs `stocksvr <args>` to its end: whether it succeeded, its standard output and
    /// its standard error.
    pub fn try_run(&self, args: &[&str], extra: &[(String, String)]) -> (bool, String, String) {
        let out = stocksvr_test_support::output_within(
            self.command(extra).args(args),
            Duration::from_secs(120),
        );
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        self.keep(format!("{stdout}{stderr}"));
        (out.status.success(), stdout, stderr)
    }

    /// `stocksvr all` on a free port, with `extra` variables.
    pub fn start(&self, extra: &[(String, String)]) -> Service {
        let extra: Vec<(String, Option<String>)> = extra
            .iter()
            .map(|(k, v)| (k.clone(), Some(v.clone())))
            .collect();
        self.start_with(&extra)
    }

    /// As [`Deployment::start`]; a `None` value unsets the variable.
    pub fn start_with(&self, extra: &[(String, Option<String>)]) -> Service {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let log = std::env::temp_dir().join(format!("{}.log", unique("stocksvr-secure")));
        let mut cmd = self.command(&[]);
        for (key, value) in extra {
            match value {
                Some(v) => cmd.env(key, v),
                None => cmd.env_remove(key),
            };
        }
        cmd.arg("all")
            .env("STOCKSVR__HTTP__LISTEN", format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        let child = ChildGuard::spawn(&mut cmd, "stocksvr all (secure)");
        self.logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(log.clone());
        Service {
            _child: child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        }
    }

    /// No password or token of the stack, nor any of `more`, in any output or log line of
    /// this deployment (which must have written more than 50 lines).
    pub fn assert_no_secret_in_any_output(&self, more: &[&str]) {
        self.assert_no_secret_in_outputs(more, 50);
    }

    /// As [`Deployment::assert_no_secret_in_any_output`], with at least `min_lines` lines
    /// written (a deployment that only ran commands writes few).
    pub fn assert_no_secret_in_outputs(&self, more: &[&str], min_lines: usize) {
        let mut texts = self
            .outputs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for log in self.logs.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            texts.push(std::fs::read_to_string(log).unwrap_or_default());
        }
        let mut secrets = self.stack.secrets();
        secrets.extend(more.iter().map(|s| s.to_string()));
        assert!(
            secrets.len() >= 10,
            "the stack's secrets were found: {}",
            secrets.len()
        );
        let lines: usize = texts.iter().map(|t| t.lines().count()).sum();
        assert!(
            lines > min_lines,
            "there are logs to look at: {lines} lines"
        );
        for secret in &secrets {
            for text in &texts {
                assert!(
                    !text.contains(secret.as_str()),
                    "a secret ({} characters) appears in: {}",
                    secret.len(),
                    text.lines()
                        .find(|l| l.contains(secret.as_str()))
                        .unwrap_or_default()
                        .replace(secret.as_str(), "<SECRET>")
                );
            }
        }
    }
}

/// A running `stocksvr all`.
pub struct Service {
    _child: ChildGuard,
    pub base: String,
    log: PathBuf,
}

impl Service {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        match reqwest::get(format!("{}{path}", self.base)).await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                (status, resp.json().await.unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null),
        }
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Polls `/readyz` until `holds` accepts its body; the body, or a panic naming the last
    /// answer and the log.
    pub async fn readyz_until(
        &self,
        what: &str,
        within: Duration,
        holds: impl Fn(u16, &Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + within;
        let mut last = (0, Value::Null);
        while Instant::now() < deadline {
            last = self.get("/readyz").await;
            if holds(last.0, &last.1) {
                return last.1;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!(
            "{what}: /readyz last answered {} {}; log:\n{}",
            last.0,
            last.1,
            self.log()
        );
    }

    /// Polls a reservation until its status is `status`.
    pub async fn wait_for_status(&self, reservation_id: &str, status: &str, within: Duration) {
        let path = format!("/v1/reservations/{reservation_id}");
        let deadline = Instant::now() + within;
        let mut last = Value::Null;
        while Instant::now() < deadline {
            last = self.get(&path).await.1;
            if last["status"] == status {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!(
            "{reservation_id} never reached {status}: {last}; log:\n{}",
            self.log()
        );
    }

    /// Lines of the log at WARN or ERROR.
    pub fn complaints(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .map(String::from)
            .collect()
    }
}
