//! Records the git revision the crate is built from (`GRADWIRE_GIT_REV`, exported as
//! `gradwire_run::GIT_REV`), so every run record, benchmark and checkpoint says which code
//! made it. Outside a git checkout the revision is `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let rev = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let rev = if dirty { format!("{rev}-dirty") } else { rev };
    println!("cargo:rustc-env=GRADWIRE_GIT_REV={rev}");
    // Rebuild when HEAD moves: the HEAD file, and the branch ref it names.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let head = Path::new(&dir).join("HEAD");
        println!("cargo:rerun-if-changed={}", head.display());
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let common = git(&["rev-parse", "--git-common-dir"]).unwrap_or(dir.clone());
            let common = if Path::new(&common).is_absolute() {
                common.into()
            } else {
                std::env::current_dir().unwrap_or_default().join(common)
            };
            println!("cargo:rerun-if-changed={}", common.join(r).display());
        }
        println!(
            "cargo:rerun-if-changed={}",
            Path::new(&dir).join("index").display()
        );
    }
    println!("cargo:rerun-if-changed=build.rs");
}
