//! `gradwire train --sync ps-sync|ps-async|ps-ssp:S`: data-parallel training against
//! parameter-server shards (`crates/ps`) instead of an all-reduce.
//!
//! As the parent (no launcher in the environment), `train` starts `--servers S` shard
//! processes (`gradwire ps serve`, each printing its address), then `--workers N` worker
//! processes of this binary (with `--worker --ps-servers ADDR,...`), waits for them and
//! stops the shards. Under a launcher (`gradwire launch`, mpirun, srun, torchrun) each rank
//! is one worker and the shards must already run: pass their addresses with
//! `--ps-servers`. Workers never form a rank mesh: they talk only to the shards, so under
//! `ps-async` a lost worker stalls nobody.
//!
//! - `ps-sync`: BSP rounds (the gradient averaged over the round's workers, then the
//!   server-side updater), the same parameters as all-reduce SGD up to float rounding;
//!   the epoch loss and the sharded evaluation are averaged through the PS.
//! - `ps-async`: DistBelief's Downpour (`--n-fetch`, `--n-push`, paper default 1 and 1);
//!   rank 0 evaluates the parameters it last fetched and reports its own loss. The shards
//!   run Downpour's Adagrad (`adagrad:lr=0.01`, [`downpour_default`]) unless an optimizer is
//!   given: server-side momentum applied to every stale worker's push multiplies the step
//!   (4 workers with momentum 0.9 diverged on the MLP, and LeNet with 2 workers ended at
//!   10%; rank 0 warns when momentum is asked for by name).
//! - `ps-ssp:S`: stale synchronous parallel with bound S (reporting as `ps-async`).
//! - with `--model-parallel K` (`ps-sync`, `ps-async`, `ps-ssp:S`): `--workers R` replicas
//!   of K partitions (R·K processes, a TCP mesh per replica for the activations); partition
//!   j of every replica pushes and pulls its own tensors as table j on its own `--servers`
//!   shards (`gradwire_job::model_parallel`).
//! - `sandblaster`: DistBelief's batch L-BFGS on the same models and data
//!   (`gradwire_job::rank::sandblaster`): a coordinator, `--workers` worker threads and the shards;
//!   one epoch is `--sb-iters` accepted L-BFGS steps.
//!
//! `--codec C` compresses every worker's push of the parameter table with gradwire codec `C`
//! (the shards `decode_add`), with error feedback at the worker (a residual per chunk):
//! error feedback is always on for compressed pushes (`ef=true` is forced into the spec).
//! `--push-codec SPEC` takes the ps crate's push-codec grammar instead, which adds MXNet's
//! 2-bit quantizer (`2bit[:threshold=T]`, default 0.5, with its own residual). Pulls stay
//! dense f32. PowerSGD (its factors need an all-reduce) and DGC (it owns its momentum, which
//! the shards' updater would apply again) are refused by name; `none`/`fp32` are dense.
//! Bytes in the JSON lines are the measured frame bytes, and `compression_ratio` is the dense
//! push size over the measured push frames (headers included).
//!
//! The server-side updater mirrors `--optimizer` (`gradwire_train::sync::ps::mirror_optimizer`):
//! SGD, SGD with momentum, Adagrad (DistBelief) and Adam, constant rate; anything else is
//! refused before a process starts. Output: the same JSON lines, metrics.jsonl and run.json
//! as all-reduce training, plus `servers`, `mode` and the measured `bytes_pulled` per epoch
//! (`bytes_sent` is what rank 0 pushed), and a `ps` object in run.json with every worker's
//! pushes, pulls and bytes, and the workers lost.

//!
//! The modes' flags, defaults and refusals are the plan's (`gradwire_job::ps`); this module
//! runs the plan.

mod run;

pub use gradwire_job::ps::{PsPlan, SbPlan};
pub use gradwire_job::PsMode;
pub use run::run;
