//! Elastic training's state handling over the in-process `Local` transport: ranks commit in
//! memory mid-epoch, a new world is built and every rank restores from rank 0's commit and
//! its own sync state (`Trainer::restore_elsewhere`). The reference is the uninterrupted run:
//! re-forming the same world must end on its parameters bit for bit (the epoch's untaken
//! samples re-dealt over the same world are the same shards, the residuals carried over),
//! and a shrunk or grown world ends in agreement on every rank.

use std::thread;

use gradwire_train::data::{Dataset, DatasetKind};
use gradwire_train::elastic::Commit;
use gradwire_train::{
    EngineConfig, EngineSync, EvalMode, GradientSync, ModelKind, TrainConfig, Trainer,
};
use gradwire_transport::local::Local;

use crate::util::real_data;

const CODEC: &str = "topk:ratio=0.05";
/// The commit's global step: inside epoch 0 (20 steps per rank in a world of 4).
const COMMIT: u64 = 8;

fn config() -> TrainConfig {
    TrainConfig {
        batch_size: 32,
        epochs: 2,
        seed: 5,
        optimizer: "sgd:lr=0.05,momentum=0.9".parse().unwrap(),
        eval: EvalMode::Off,
        ..TrainConfig::default()
    }
}

fn data() -> Option<Dataset> {
    let mut d = real_data(DatasetKind::FashionMnist, 0)?;
    d.truncate(4 * 32 * 20, 500);
    Some(d)
}

fn trainer(t: Local, data: &Dataset) -> Trainer<EngineSync> {
    let cfg = config();
    let model = ModelKind::Mlp.build(data.shape(), cfg.seed).unwrap();
    let engine = EngineConfig {
        codec: CODEC.parse().unwrap(),
        seed: cfg.seed,
        ..EngineConfig::default()
    };
    let sync = EngineSync::new(t, engine, &model.tensors(), 20).unwrap();
    Trainer::new(model, sync, cfg, data.train.len()).unwrap()
}

/// Every rank of a world of `n` runs `f` on its trainer; the results in rank order.
fn world<R: Send>(
    n: usize,
    data: &Dataset,
    f: impl Fn(&mut Trainer<EngineSync>) -> R + Sync,
) -> Vec<R> {
    thread::scope(|s| {
        let hs: Vec<_> = Local::world(n)
            .into_iter()
            .map(|t| {
                let f = &f;
                s.spawn(move || f(&mut trainer(t, data)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Runs until every epoch is done; the final parameters.
fn finish(tr: &mut Trainer<EngineSync>, data: &Dataset) -> Vec<f32> {
    tr.fit(data, &mut |_| {}, &mut |_| {}).unwrap();
    tr.params().to_vec()
}

/// The first world's commits at step [`COMMIT`], one per rank.
fn commits(data: &Dataset) -> Vec<Commit> {
    world(4, data, |tr| {
        assert!(tr
            .run_epoch_until(data, &mut |_| {}, Some(COMMIT))
            .unwrap()
            .is_none());
        tr.commit().unwrap()
    })
}

/// Restores `shared` (rank 0's commit) and `own[rank]` on each rank of a world of `n`, then
/// finishes the run; each rank's final parameters and the tensors it reset.
fn continue_in(
    n: usize,
    data: &Dataset,
    shared: &Commit,
    own: &[Option<Commit>],
) -> Vec<(Vec<f32>, Vec<String>)> {
    world(n, data, |tr| {
        let rank = tr.sync().rank();
        let reset = tr
            .restore_elsewhere(shared, own[rank].as_ref(), data.train.len())
            .unwrap();
        assert_eq!(tr.global_step(), COMMIT);
        assert_eq!(tr.params(), &shared.checkpoint.params[..]);
        (finish(tr, data), reset)
    })
}

#[test]
fn re_forming_the_same_world_ends_on_the_uninterrupted_parameters() {
    let Some(data) = data() else { return };
    let whole = world(4, &data, |tr| finish(tr, &data));
    let commits = commits(&data);
    let own: Vec<Option<Commit>> = commits.iter().cloned().map(Some).collect();
    let again = continue_in(4, &data, &commits[0], &own);
    for (rank, (params, reset)) in again.iter().enumerate() {
        assert!(reset.is_empty(), "rank {rank} reset {reset:?}");
        assert!(params == &whole[rank], "rank {rank} ended elsewhere");
    }
    // Without its residuals (a rank that starts fresh), the run ends elsewhere: the
    // comparison above can fail.
    let mut fresh = own.clone();
    fresh[2] = None;
    let other = continue_in(4, &data, &commits[0], &fresh);
    assert!(other[0].0 != whole[0], "the residuals changed nothing");
}

#[test]
fn a_shrunk_and_a_grown_world_finish_in_agreement() {
    let Some(data) = data() else { return };
    let commits = commits(&data);
    // Rank 3 lost: ranks 0-2 go on with their own commits; the epoch's untaken samples
    // (rank 3's too) are dealt over three.
    let own: Vec<Option<Commit>> = commits[..3].iter().cloned().map(Some).collect();
    let three = continue_in(3, &data, &commits[0], &own);
    for (rank, (p, reset)) in three.iter().enumerate() {
        assert!(reset.is_empty(), "rank {rank} reset {reset:?}");
        assert!(p == &three[0].0, "rank {rank} disagrees after shrinking");
    }
    // A fifth rank joins with no state of its own.
    let mut own: Vec<Option<Commit>> = commits.iter().cloned().map(Some).collect();
    own.push(None);
    let five = continue_in(5, &data, &commits[0], &own);
    for (rank, (p, _)) in five.iter().enumerate() {
        assert!(p == &five[0].0, "rank {rank} disagrees after growing");
    }
    assert!(three[0].0 != five[0].0);
}

/// A commit passed as bytes (what rank 0 broadcasts to a new world) is the same commit.
#[test]
fn a_commit_crosses_as_bytes() {
    let Some(data) = data() else { return };
    let c = commits(&data).swap_remove(1);
    assert_eq!(Commit::from_bytes(&c.to_bytes()).unwrap(), c);
}
