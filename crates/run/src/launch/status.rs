//! How a rank's exit status is reported.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// The exit code that reports `status` (128 + signal for a killed rank).
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

/// Human words for an exit status (`exit code 3`, `killed by signal 9`).
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        (None, None) => "unknown status".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn sh(script: &str) -> ExitStatus {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .status()
            .expect("running sh")
    }

    #[test]
    fn an_exit_code_is_reported_as_itself() {
        let s = sh("exit 3");
        assert_eq!(exit_code(s), 3);
        assert_eq!(describe(s), "exit code 3");
        let ok = sh("exit 0");
        assert_eq!(exit_code(ok), 0);
        assert_eq!(describe(ok), "exit code 0");
    }

    #[test]
    fn a_killed_process_is_reported_as_128_plus_the_signal() {
        let s = sh("kill -9 $$");
        assert_eq!(s.signal(), Some(9));
        assert_eq!(exit_code(s), 137);
        assert_eq!(describe(s), "killed by signal 9");
        let t = sh("kill -TERM $$");
        assert_eq!(exit_code(t), 128 + libc::SIGTERM);
        assert_eq!(describe(t), format!("killed by signal {}", libc::SIGTERM));
    }
}
