; Definitions and references for Bash.
(function_definition name: (word) @name) @definition.function
(program (variable_assignment name: (variable_name) @name) @definition.constant)
(command name: (command_name (word) @reference.call))
