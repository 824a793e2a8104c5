from picospec.tools.bench import main

main()
