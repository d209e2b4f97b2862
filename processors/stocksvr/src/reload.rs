//! Files the listener reads again while it runs (the client list of `http.auth.clients_file`,
//! the certificate, key and client CA of `http.tls`): every `http.reload_interval_ms` and
//! on SIGHUP. A file is applied only when its bytes changed and they are valid as a whole;
//! a file caught mid-write or broken keeps what was in effect, and says why once (not at
//! every look), so a revoked token stops working at the next look after a good write.

use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::watch;

/// A group of files applied together.
pub trait Watched: Send {
    /// What the files are, for the log lines (`http.auth.clients_file`).
    fn what(&self) -> &'static str;
    fn files(&self) -> &[PathBuf];
    /// Puts the files' contents (in [`Watched::files`] order) in effect, or says why not.
    /// `Ok` carries a summary for the log line.
    fn apply(&mut self, contents: &[Vec<u8>]) -> Result<String, String>;
}

struct Entry {
    watched: Box<dyn Watched>,
    last: Vec<Vec<u8>>,
    last_error: Option<String>,
}

pub struct Reloader {
    entries: Vec<Entry>,
}

async fn read_all(files: &[PathBuf]) -> Result<Vec<Vec<u8>>, String> {
    let mut contents = Vec::with_capacity(files.len());
    for file in files {
        let bytes = tokio::fs::read(file)
            .await
            .map_err(|e| format!("{}: {e}", file.display()))?;
        contents.push(bytes);
    }
    Ok(contents)
}

impl Reloader {
    /// Applies every group once: at start a missing or invalid file is an error (the
    /// service refuses to start rather than run with no or the wrong callers).
    pub async fn start(watched: Vec<Box<dyn Watched>>) -> Result<Self, String> {
        let mut entries = Vec::with_capacity(watched.len());
        for mut watched in watched {
            let contents = read_all(watched.files()).await?;
            watched
                .apply(&contents)
                .map_err(|e| format!("{}: {e}", watched.what()))?;
            entries.push(Entry {
                watched,
                last: contents,
                last_error: None,
            });
        }
        Ok(Self { entries })
    }

    /// Reads every group again and applies the ones that changed.
    pub async fn check(&mut self) {
        for entry in &mut self.entries {
            let what = entry.watched.what();
            let outcome = match read_all(entry.watched.files()).await {
                Ok(contents) if contents == entry.last => continue,
                Ok(contents) => entry
                    .watched
                    .apply(&contents)
                    .map(|summary| (summary, contents)),
                Err(e) => Err(e),
            };
            match outcome {
                Ok((summary, contents)) => {
                    tracing::info!(files = what, "reloaded: {summary}");
                    entry.last = contents;
                    entry.last_error = None;
                }
                Err(e) if entry.last_error.as_ref() != Some(&e) => {
                    tracing::error!(files = what, error = %e, "not reloaded, the previous one stays in effect");
                    entry.last_error = Some(e);
                }
                Err(_) => {}
            }
        }
    }

    /// Checks every `interval` (none when zero) and on each SIGHUP, until `stop`.
    pub async fn run(
        mut self,
        interval: Duration,
        mut stop: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let mut hangup = Hangup::install()?;
        let mut tick = (!interval.is_zero()).then(|| {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick
        });
        loop {
            tokio::select! {
                _ = stop.wait_for(|stop| *stop) => return Ok(()),
                () = async {
                    match tick.as_mut() {
                        Some(tick) => { tick.tick().await; }
                        None => std::future::pending().await,
                    }
                } => {}
                Some(()) = hangup.recv() => {
                    tracing::info!("SIGHUP: reading the listener's files again");
                }
            }
            self.check().await;
        }
    }
}

/// SIGHUP, the conventional "read your configuration files again". Installing it also
/// keeps a SIGHUP from ending the process (its default).
struct Hangup(#[cfg(unix)] tokio::signal::unix::Signal);

impl Hangup {
    fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self(signal(SignalKind::hangup())?))
        }
        #[cfg(not(unix))]
        Ok(Self())
    }

    async fn recv(&mut self) -> Option<()> {
        #[cfg(unix)]
        {
            self.0.recv().await
        }
        #[cfg(not(unix))]
        std::future::pending().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Applies any content that is valid UTF-8 without a `!`, and records it.
    struct Recorder {
        files: Vec<PathBuf>,
        applied: Arc<Mutex<Vec<String>>>,
    }

    impl Watched for Recorder {
        fn what(&self) -> &'static str {
            "test file"
        }
        fn files(&self) -> &[PathBuf] {
            &self.files
        }
        fn apply(&mut self, contents: &[Vec<u8>]) -> Result<String, String> {
            let text = String::from_utf8(contents[0].clone()).map_err(|e| e.to_string())?;
            if text.contains('!') {
                return Err("broken".into());
            }
            self.applied.lock().expect("lock").push(text.clone());
            Ok(text)
        }
    }

    #[tokio::test]
    async fn only_a_changed_valid_file_is_applied_and_a_broken_one_keeps_the_last() {
        let dir = std::env::temp_dir().join(format!("reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("clients");
        std::fs::write(&file, "one").expect("write");
        let applied = Arc::new(Mutex::new(Vec::new()));
        let mut reloader = Reloader::start(vec![Box::new(Recorder {
            files: vec![file.clone()],
            applied: applied.clone(),
        })])
        .await
        .expect("starts");
        reloader.check().await;
        std::fs::write(&file, "broken!").expect("write");
        reloader.check().await;
        std::fs::remove_file(&file).expect("remove");
        reloader.check().await;
        std::fs::write(&file, "two").expect("write");
        reloader.check().await;
        reloader.check().await;
        assert_eq!(*applied.lock().expect("lock"), ["one", "two"]);

        std::fs::remove_file(&file).expect("remove");
        let missing = Reloader::start(vec![Box::new(Recorder {
            files: vec![file.clone()],
            applied,
        })])
        .await;
        assert!(missing.is_err_and(|e| e.contains("clients")));
        let _ = std::fs::remove_dir_all(dir);
    }
}
