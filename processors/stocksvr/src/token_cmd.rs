//! `stocksvr token hash` and `stocksvr token new`: the bearer tokens of the API's callers.
//! The service keeps only a token's SHA-256 (`http.auth.clients`, `http.auth.clients_file`),
//! so a token is shown once, when it is made, and never again by anything.

use clap::Subcommand;
use std::io::BufRead;
use std::process::ExitCode;
use stocksvr_api::auth::digest_hex;
use stocksvr_pipeline::config::{HttpClient, Scope, Secret};

#[derive(Subcommand)]
pub enum TokenAction {
    /// Read a token from standard input (its first line) and print its SHA-256: the
    /// `token_sha256` of `http.auth.clients`, the second field of a `clients_file` line.
    Hash,
    /// Make a random token for a new client and print it (this once: only its digest is
    /// kept) with the configuration lines that let it in.
    New {
        /// The client's name, in logs and in the `client` label of the metrics.
        #[arg(long)]
        name: String,
        /// What it may call: `api` (the Try API), `admin` (/admin/*); repeat for both.
        #[arg(long = "scope", value_parser = ["api", "admin"], default_value = "api")]
        scopes: Vec<String>,
    },
}

pub fn run(action: TokenAction) -> anyhow::Result<ExitCode> {
    match action {
        TokenAction::Hash => {
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)?;
            let token = line.trim_end_matches(['\n', '\r']);
            check_token(token)?;
            println!("{}", digest_hex(token));
        }
        TokenAction::New { name, scopes } => {
            let scopes: Vec<Scope> = scopes.iter().filter_map(|s| Scope::parse(s)).collect();
            let token = new_token()?;
            let client = HttpClient {
                name,
                token_sha256: Some(Secret::new(digest_hex(&token))),
                subject: None,
                scopes,
            };
            client.validate().map_err(anyhow::Error::msg)?;
            print!("{}", instructions(&client, &token));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What a bearer header can carry: no whitespace, not empty.
fn check_token(token: &str) -> anyhow::Result<()> {
    if token.is_empty() || token.contains(char::is_whitespace) {
        anyhow::bail!("a token is one word: no spaces, not empty (read from the first line of standard input)");
    }
    Ok(())
}

/// 32 random bytes from the operating system's generator (through rustls' ring provider),
/// in hex, after a prefix that lets secret scanners recognize a leaked one.
fn new_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    stocksvr::ring_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| anyhow::anyhow!("the system's random generator failed"))?;
    Ok(format!("stocksvr_{}", hex_of(&bytes)))
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn instructions(client: &HttpClient, token: &str) -> String {
    let digest = client
        .token_sha256
        .as_ref()
        .map(|d| d.expose().to_string())
        .unwrap_or_default();
    let names: Vec<&str> = client
        .scopes
        .iter()
        .map(|s| match s {
            Scope::Api => "api",
            Scope::Admin => "admin",
        })
        .collect();
    let name = &client.name;
    format!(
        "token of {name} (shown this once; the service keeps only its SHA-256; the client sends \
         Authorization: Bearer <token>):\n{token}\n\n\
         a line of http.auth.clients_file:\n{name} {digest} {}\n\n\
         or in the configuration file:\n[[http.auth.clients]]\nname = \"{name}\"\n\
         token_sha256 = \"{digest}\"\nscopes = [{}]\n",
        names.join(","),
        names
            .iter()
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_token_is_random_and_its_lines_configure_exactly_it() {
        let (a, b) = (new_token().expect("token"), new_token().expect("token"));
        assert_ne!(a, b);
        assert_eq!(a.len(), "stocksvr_".len() + 64);
        let client = HttpClient {
            name: "orders".into(),
            token_sha256: Some(Secret::new(digest_hex(&a))),
            subject: None,
            scopes: vec![Scope::Api, Scope::Admin],
        };
        let text = instructions(&client, &a);
        let line = text
            .lines()
            .find(|l| l.starts_with("orders "))
            .expect("clients_file line");
        let parsed = stocksvr_pipeline::config::parse_clients_file(line).expect("parses");
        assert_eq!(parsed, std::slice::from_ref(&client));
        let toml_part = &text[text.find("[[http.auth.clients]]").expect("toml")..];
        #[derive(serde::Deserialize)]
        struct File {
            http: Http,
        }
        #[derive(serde::Deserialize)]
        struct Http {
            auth: stocksvr_pipeline::config::HttpAuthSettings,
        }
        let file: File = load_toml(toml_part);
        assert_eq!(file.http.auth.clients, [client]);
        assert!(check_token("two words").is_err() && check_token("").is_err());
    }

    /// The TOML lines through the configuration loader stocksvr itself uses.
    fn load_toml<T: serde::de::DeserializeOwned>(text: &str) -> T {
        let dir = std::env::temp_dir().join(format!("token-cmd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("c.toml");
        std::fs::write(&file, text).expect("write");
        let parsed = stocksvr_pipeline::config::load_layered(Some(&file), Some(Default::default()))
            .expect("loads");
        let _ = std::fs::remove_dir_all(dir);
        parsed
    }
}
