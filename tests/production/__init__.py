"""Running kbpg for real: the embedded server, least privilege, standbys, upgrades, access control, the app object."""
