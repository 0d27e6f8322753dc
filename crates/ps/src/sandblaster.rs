//! Sandblaster L-BFGS (DistBelief): placeholder, filled in below.
