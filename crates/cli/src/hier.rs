//! Where the ranks are, for the commands: the host detection and hierarchical all-reduce of
//! [`gradwire_engine::HostGroups`] (`GRADWIRE_HOSTS`, `GRADWIRE_HOST`, the host name;
//! `GRADWIRE_HIERARCHICAL=0` turns it off). `check` and `bench allreduce` use [`detect`];
//! `train` and `bench engine` hand `gradwire_engine::host_config_from_env` to the engine,
//! which makes the same choice for its dense tensors.

use anyhow::Result;
use gradwire_transport::Transport;

pub use gradwire_engine::HostGroups as Hier;

/// After joining over TCP: the hierarchy when the ranks' hosts call for it
/// ([`gradwire_engine::HostGroups::connect_from_env`]); `None` when flat.
pub fn detect(t: &mut dyn Transport) -> Result<Option<Hier>> {
    Ok(Hier::connect_from_env(t)?)
}
