//! Reading a rank's identity from the environment (work in progress).
