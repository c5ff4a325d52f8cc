//! Completing the launch lifecycle hook once the node is Ready.
