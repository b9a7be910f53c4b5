"""The lab in a browser: `andrea lab` serves one page whose views are fed by JSON endpoints that
call the functions of `andrea.lab` (see `andrea.web.server`)."""
