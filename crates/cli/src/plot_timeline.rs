//! One training step of a merged timeline drawn as a PNG beside it, for `report`:
//! `gradwire_job::plot::timeline`.

pub use gradwire_job::plot::plot_step;
