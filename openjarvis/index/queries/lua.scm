; Definitions and references for Lua.
(function_declaration name: (identifier) @name) @definition.function
(function_declaration name: (dot_index_expression field: (identifier) @name)) @definition.function
(function_declaration name: (method_index_expression method: (identifier) @name)) @definition.method
(assignment_statement (variable_list name: (identifier) @name) (expression_list value: (function_definition))) @definition.function
(assignment_statement (variable_list name: (dot_index_expression field: (identifier) @name)) (expression_list value: (function_definition))) @definition.function
(function_call name: (identifier) @reference.call)
(function_call name: (dot_index_expression field: (identifier) @reference.call))
(function_call name: (method_index_expression method: (identifier) @reference.call))
