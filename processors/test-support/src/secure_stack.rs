//! The secure private stack a test binary shares (`scripts/stack up --secure`): started once,
//! on first use, and stopped when the test process exits; the settings of each of its
//! principals as `scripts/stack env` prints them; and databases of a test's own, created and
//! migrated by the stack's admin user and used by the DML-only service user, as the stack's
//! grants allow (`stocksvr` may change rows of `stocksvr\_test\_%` databases, not tables).

use crate::{block_on_cleanup, unique, PrivateStack};
use sqlx::MySqlPool;
use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use stocksvr_pipeline::config::{load_layered, resolve_connections, InfraSettings};

/// Every server of the secure stack a test of stocksvr needs.
const SERVICES: [&str; 4] = ["kafka", "registry", "mariadb", "redis"];

/// The secure stack of this test binary, started on first use (about half a minute) and
/// shared by every test of the binary; each test keeps to its own topic namespace, groups
/// and database.
pub fn secure_stack() -> &'static PrivateStack {
    static STACK: OnceLock<PrivateStack> = OnceLock::new();
    STACK.get_or_init(|| {
        stocksvr_pipeline::tls::install_crypto_provider();
        let started = Instant::now();
        let stack = PrivateStack::start_secure(&SERVICES);
        stack.stop_with_this_process();
        eprintln!(
            "secure private stack up in {:.1} s ({})",
            started.elapsed().as_secs_f64(),
            stack.dir.display()
        );
        stack
    })
}

impl PrivateStack {
    /// Every variable `scripts/stack env` exports (`STOCKSVR__...` and `STACK_...`).
    pub fn exports(&self) -> &[(String, String)] {
        self.exports.get_or_init(|| {
            let out = crate::output_within(self.command().arg("env"), Duration::from_secs(30));
            assert!(out.status.success(), "scripts/stack env failed");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.strip_prefix("export "))
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
                .collect()
        })
    }

    /// One exported variable.
    pub fn export(&self, key: &str) -> String {
        self.exports()
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("scripts/stack env exports no {key}"))
    }

    /// The `STOCKSVR__...` variables of the service's own principal (`stocksvr`).
    pub fn service_env(&self) -> Vec<(String, String)> {
        self.exports()
            .iter()
            .filter(|(k, _)| k.starts_with("STOCKSVR__"))
            .cloned()
            .collect()
    }

    /// The service's connection settings, loaded as the binary loads them (secret files
    /// read), with `overrides` on top.
    pub fn settings(&self, overrides: &[(&str, &str)]) -> InfraSettings {
        let mut env: HashMap<String, String> = self.service_env().into_iter().collect();
        env.extend(
            overrides
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let mut s: InfraSettings = load_layered(None, Some(env)).expect("the stack's settings");
        resolve_connections(&mut s.kafka, &mut s.registry, &mut s.mysql, &mut s.redis)
            .expect("the stack's secret files");
        s
    }

    /// The variables that make a `stocksvr` command reach Kafka as another principal of the
    /// stack: `role` is the infix of its `STACK_KAFKA_<ROLE>_*` variables (`TOPICS_ADMIN`,
    /// `LAG`, `ORDER_SERVICE`).
    pub fn kafka_principal_env(&self, role: &str) -> Vec<(String, String)> {
        let var = |suffix: &str| self.export(&format!("STACK_KAFKA_{role}_{suffix}"));
        vec![
            ("STOCKSVR__KAFKA__SASL__USERNAME".into(), var("USER")),
            (
                "STOCKSVR__KAFKA__SASL__PASSWORD_FILE".into(),
                var("PASSWORD_FILE"),
            ),
            ("STOCKSVR__KAFKA__TLS__CERT_FILE".into(), var("CERT_FILE")),
            ("STOCKSVR__KAFKA__TLS__KEY_FILE".into(), var("KEY_FILE")),
        ]
    }

    /// Adds the ACLs of `kafka-acls` lines (`scripts/stack acls apply -`, as an operator
    /// would apply `stocksvr acls print`); returns what the script said.
    pub fn apply_acls(&self, lines: &str) -> String {
        use std::io::Write;
        let mut child = self
            .command()
            .args(["acls", "apply", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("scripts/stack acls apply runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(lines.as_bytes())
            .expect("ACL lines written");
        let out = child.wait_with_output().expect("acls apply ends");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "acls apply refused the lines: {said}");
        said
    }

    /// Every password and token of the stack, for checking that none reaches a log.
    pub fn secrets(&self) -> Vec<String> {
        let dir = self.dir.join("data/secrets");
        let mut found: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|x| x == "password" || x == "token")
            })
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .map(|s| s.trim_end().to_string())
            .filter(|s| s.len() >= 8)
            .collect();
        found.sort();
        found
    }

    /// A database of the test's own, created and migrated by the stack's admin user.
    pub async fn database(&self) -> SecureDb {
        let admin_url = self.admin_url();
        let name = unique("stocksvr_test");
        let admin =
            stocksvr_store::mysql_pool(&admin_url, 1, Duration::from_secs(10)).expect("admin pool");
        sqlx::query(&format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
            .execute(&admin)
            .await
            .expect("the admin user creates the test database");
        admin.close().await;
        let migrator =
            stocksvr_store::mysql_pool(&in_database(&admin_url, &name), 1, Duration::from_secs(10))
                .expect("admin pool on the test database");
        stocksvr_store::migrate(&migrator)
            .await
            .expect("migrated as the admin user");
        migrator.close().await;
        let url = in_database(&self.export("STOCKSVR__MYSQL__URL"), &name);
        let service = self.settings(&[("STOCKSVR__MYSQL__URL", &url)]);
        let pool =
            stocksvr_store::mysql_pool(service.mysql.url.expose(), 4, Duration::from_secs(10))
                .expect("service pool");
        SecureDb {
            name,
            url,
            pool,
            admin_url,
        }
    }

    /// The admin user's URL, password included (never print it).
    fn admin_url(&self) -> String {
        let admin = self.settings(&[
            (
                "STOCKSVR__MYSQL__URL",
                &self.export("STACK_MYSQL_ADMIN_URL"),
            ),
            (
                "STOCKSVR__MYSQL__PASSWORD_FILE",
                &self.export("STACK_MYSQL_ADMIN_PASSWORD_FILE"),
            ),
        ]);
        admin.mysql.url.expose().to_string()
    }

    /// Stops the stack and deletes it when this process ends, however it ends: a static
    /// shared by the tests is never dropped, so a watchdog of its own (in a session of its
    /// own, out of reach of the test harness' signals) waits for this process to go.
    pub(crate) fn stop_with_this_process(&self) {
        let keep = std::env::var("STOCKSVR_TEST_KEEP").as_deref() == Ok("1");
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \"$0\" down >/dev/null 2>&1; {remove}",
            pid = std::process::id(),
            remove = if keep { "true" } else { "rm -rf \"$STACK_DIR\"" },
        );
        let stack = self.command();
        // `setsid --fork` returns at once, leaving the watchdog to init.
        let mut watchdog = Command::new("setsid");
        watchdog
            .arg("--fork")
            .arg("bash")
            .arg("-c")
            .arg(script)
            .arg(stack.get_program())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in stack.get_envs() {
            match v {
                Some(v) => watchdog.env(k, v),
                None => watchdog.env_remove(k),
            };
        }
        let started = watchdog.status().expect("setsid runs");
        assert!(started.success(), "the stack's watchdog did not start");
    }
}

/// `url` (a `mysql://` URL with a query) naming database `name` instead of its own.
fn in_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let (server, _) = base.rsplit_once('/').expect("the URL names a database");
    if query.is_empty() {
        format!("{server}/{name}")
    } else {
        format!("{server}/{name}?{query}")
    }
}

/// A database of a test's own on the secure stack, dropped by the admin user when the test
/// ends.
pub struct SecureDb {
    pub name: String,
    /// The service user's URL of it, without the password (which comes from the stack's
    /// `STOCKSVR__MYSQL__PASSWORD_FILE`): `STOCKSVR__MYSQL__URL` for a child process.
    pub url: String,
    /// A pool of the service user.
    pub pool: MySqlPool,
    admin_url: String,
}

impl Drop for SecureDb {
    fn drop(&mut self) {
        let (name, admin_url) = (self.name.clone(), self.admin_url.clone());
        block_on_cleanup(format!("database {name}"), async move {
            let admin = stocksvr_store::mysql_pool(&admin_url, 1, Duration::from_secs(10))
                .map_err(|e| e.to_string())?;
            sqlx::query(&format!("DROP DATABASE IF EXISTS `{name}`"))
                .execute(&admin)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_moved_to_another_database_with_its_query() {
        assert_eq!(
            in_database(
                "mysql://u@h:1/stocksvr?ssl-mode=VERIFY_IDENTITY&ssl-ca=/x/ca.crt",
                "t_1"
            ),
            "mysql://u@h:1/t_1?ssl-mode=VERIFY_IDENTITY&ssl-ca=/x/ca.crt"
        );
        assert_eq!(in_database("mysql://u:p@h/db", "t_2"), "mysql://u:p@h/t_2");
    }
}
