//! The listener's front door, as `[http]` asks: the caller check in front of every route
//! (`stocksvr_api::auth`), plain HTTP or HTTPS, and the task that reads
//! `http.auth.clients_file` and the TLS files again while the service runs.

use crate::callers::{self, ClientsFile};
use crate::reload::{Reloader, Watched};
use crate::settings::{Access, AdminAccess};
use crate::tls::{ListenerTls, TlsState};
use anyhow::Context;
use axum::Router;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_api::auth::{self, Gate, Guard, Policy};
use stocksvr_pipeline::config::HttpSettings;
use tokio::sync::watch;

pub struct Front {
    gate: Gate,
    tls: Option<Arc<TlsState>>,
    reloader: Option<Reloader>,
    reload_every: Duration,
}

/// `http.tls`'s files, applied to the listener's TLS configuration.
struct TlsReload {
    files: ListenerTls,
    state: Arc<TlsState>,
}

impl Watched for TlsReload {
    fn what(&self) -> &'static str {
        "http.tls"
    }

    fn files(&self) -> &[PathBuf] {
        &self.files.files
    }

    fn apply(&mut self, contents: &[Vec<u8>]) -> Result<String, String> {
        self.state.replace(self.files.server_config(contents)?);
        Ok("certificate, key and client CA in effect for new connections".into())
    }
}

impl Front {
    /// Reads the clients file and the TLS files once: a missing or invalid one refuses the
    /// start, naming the file.
    pub async fn prepare(http: &HttpSettings, access: Access) -> anyhow::Result<Self> {
        let policy = Policy {
            public_paths: http.public_paths.clone(),
            api: access.api,
            admin: match access.admin {
                AdminAccess::Token => Guard::Callers,
                // Refused: the admin routes themselves answer 403 admin_disabled.
                AdminAccess::Open | AdminAccess::Refused => Guard::Open,
            },
        };
        let static_callers = callers::build(http, None)
            .map_err(anyhow::Error::msg)
            .context("http.auth")?;
        let gate = Gate::new(policy, static_callers);
        let mut watched: Vec<Box<dyn Watched>> = Vec::new();
        if let Some(file) = &http.auth.clients_file {
            watched.push(Box::new(ClientsFile {
                gate: gate.clone(),
                http: http.clone(),
                files: vec![PathBuf::from(file)],
            }));
        }
        let tls = ListenerTls::from_settings(http).map(|files| {
            let state = Arc::new(TlsState::default());
            watched.push(Box::new(TlsReload {
                files,
                state: state.clone(),
            }));
            state
        });
        let reloader = match watched.is_empty() {
            true => None,
            false => Some(Reloader::start(watched).await.map_err(anyhow::Error::msg)?),
        };
        Ok(Self {
            gate,
            tls,
            reloader,
            reload_every: Duration::from_millis(http.reload_interval_ms),
        })
    }

    pub fn https(&self) -> bool {
        self.tls.is_some()
    }

    /// How many tokens and certificate subjects are configured now.
    pub fn callers(&self) -> usize {
        self.gate.callers().len()
    }

    /// The listener's future (serving `router` behind the caller check until `stop`), and
    /// the reload task's when there are files to watch.
    pub fn into_tasks(
        self,
        listener: tokio::net::TcpListener,
        router: Router,
        stop: watch::Receiver<bool>,
    ) -> (
        impl std::future::Future<Output = anyhow::Result<()>>,
        Option<impl std::future::Future<Output = anyhow::Result<()>>>,
    ) {
        let router = router.layer(axum::middleware::from_fn_with_state(
            self.gate.clone(),
            auth::check,
        ));
        let mut http_stop = stop.clone();
        let shutdown = async move {
            let _ = http_stop.wait_for(|stop| *stop).await;
        };
        let tls = self.tls;
        let serve = async move {
            match tls {
                Some(tls) => crate::tls::serve(listener, tls, router, shutdown).await,
                None => stocksvr_pipeline::http::serve(listener, router, shutdown).await,
            }
            .map_err(anyhow::Error::from)
        };
        let every = self.reload_every;
        let reload = self.reloader.map(|r| r.run(every, stop));
        (serve, reload)
    }
}
