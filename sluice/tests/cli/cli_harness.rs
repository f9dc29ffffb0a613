//! Runs the `sluice` binary on a table of its own in DynamoDB Local.

#![allow(dead_code, unreachable_pub)]

use std::process::Command;

use serde_json::Value;

use crate::dynamo;

/// One run of the binary.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// The binary on a table of its own.
pub struct Cli {
    pub endpoint: String,
    pub table: String,
}

impl Cli {
    /// `None` (skip) without DynamoDB Local, as the other DynamoDB tests do.
    pub fn new() -> Option<Cli> {
        let endpoint = dynamo::endpoint()?;
        Some(Cli {
            endpoint,
            table: format!("sluice-cli-{:016x}", rand::random::<u64>()),
        })
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .args(args)
            .env_remove("SLUICE_TABLE_NAME")
            .env_remove("SLUICE_LEASE_TTL_MS")
            .env("SLUICE_ENDPOINT_URL", &self.endpoint)
            .env("SLUICE_TABLE_NAME", &self.table)
            .env("AWS_ACCESS_KEY_ID", "sluicelocal")
            .env("AWS_SECRET_ACCESS_KEY", "sluicelocal")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true");
        command
    }

    pub fn run(&self, args: &[&str]) -> Run {
        let output = self.command(args).output().expect("run sluice");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8(output.stdout).unwrap(),
            stderr: String::from_utf8(output.stderr).unwrap(),
        }
    }

    /// Runs and expects success.
    pub fn ok(&self, args: &[&str]) -> String {
        let run = self.run(args);
        assert_eq!(
            run.code, 0,
            "sluice {args:?} failed:\n{}\n{}",
            run.stdout, run.stderr
        );
        run.stdout
    }

    /// Runs and expects exit `code` with `message` on stderr.
    pub fn fails(&self, args: &[&str], code: i32, message: &str) -> Run {
        let run = self.run(args);
        assert_eq!(
            run.code, code,
            "sluice {args:?}: exit {} (wanted {code}):\n{}\n{}",
            run.code, run.stdout, run.stderr
        );
        assert!(
            run.stderr.contains(message),
            "sluice {args:?}: stderr lacks {message:?}:\n{}",
            run.stderr
        );
        run
    }

    pub fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).expect("JSON output")
    }

    pub fn file(&self, text: &str) -> std::path::PathBuf {
        let path =
            std::env::temp_dir().join(format!("{}-{:08x}.toml", self.table, rand::random::<u32>()));
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// A bucket file of three buckets.
pub const FILE: &str = r#"
["openai#rpm"]
type = "requests"
refill = "500/min"
capacity = 500

["openai#tpm"]
type = "tokens"
refill = "2000000/min"

["eleven#concurrent"]
type = "concurrent"
capacity = 10
"#;
