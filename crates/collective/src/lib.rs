//! gradwire-collective: collective algorithms over any [`Transport`](gradwire_transport::Transport).
#![deny(missing_docs)]
