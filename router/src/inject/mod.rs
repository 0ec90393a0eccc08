pub(crate) mod oauth;
