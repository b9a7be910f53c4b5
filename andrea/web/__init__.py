"""The lab in a browser: `andrea lab` serves one page whose views are fed by JSON endpoints that
call the functions of `andrea.inside.embed` (see `andrea.web.lab`)."""
