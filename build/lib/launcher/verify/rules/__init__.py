"""The checks, one function each, with how each counts declared next to it (`base.check`);
`launcher.verify.registry` lists them."""
