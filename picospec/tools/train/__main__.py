from picospec.tools.train import main

main()
