from picospec.tools.cli import command_line

command_line()
