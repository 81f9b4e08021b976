; Definitions and references for JavaScript.
(class_declaration name: (identifier) @name) @definition.class
(class name: (identifier) @name) @definition.class
(function_declaration name: (identifier) @name) @definition.function
(generator_function_declaration name: (identifier) @name) @definition.function
(method_definition name: (property_identifier) @name) @definition.method
(lexical_declaration (variable_declarator name: (identifier) @name value: [(arrow_function) (function_expression)]) @definition.function)
(variable_declaration (variable_declarator name: (identifier) @name value: [(arrow_function) (function_expression)]) @definition.function)
(assignment_expression left: (member_expression property: (property_identifier) @name) right: [(arrow_function) (function_expression)]) @definition.function
(pair key: (property_identifier) @name value: [(arrow_function) (function_expression)]) @definition.function
(program (lexical_declaration (variable_declarator name: (identifier) @name value: [(string) (number) (object) (array) (call_expression) (new_expression)])) @definition.constant)
(call_expression function: (identifier) @reference.call)
(call_expression function: (member_expression property: (property_identifier) @reference.call))
(new_expression constructor: (identifier) @reference.type)
(import_specifier name: (identifier) @reference.import)
(arguments (identifier) @reference.use)
(class_heritage (identifier) @reference.type)
